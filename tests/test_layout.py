"""The package's layout rules (issue #91): the decoding package is keras.ops only, no module
is over 800 lines and no function over 80 code lines."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_transformer"
MAX_MODULE_LINES = 800
MAX_FUNCTION_CODE_LINES = 80
# The embedded corpus's word lists: data, not code.
LONG_MODULES_ALLOWED = {"data/embedded.py"}


def modules():
    return sorted(PACKAGE.rglob("*.py"))


def code_lines(lines, node):
    """A function's lines that hold code: not blank, not a comment, not its docstring."""
    skip = set()
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        skip = set(range(first.lineno, first.end_lineno + 1))
    return sum(1 for number in range(node.lineno, node.end_lineno + 1)
               if number not in skip and lines[number - 1].strip() and not lines[number - 1].strip().startswith("#"))


def test_the_decoding_package_imports_no_tensorflow():
    """`keras_transformer/decoding/` is written in keras.ops (every backend, LiteRT's builtins);
    TensorFlow-only code is `keras_transformer.searcher`'s and `translator`'s."""
    found = []
    for path in sorted((PACKAGE / "decoding").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}: {name}" for name in names if name.split(".")[0] in ("tensorflow", "tensorflow_text")]
    assert not found, found
    assert len(list((PACKAGE / "decoding").glob("*.py"))) >= 8  # (the rule is checked on the package's modules)


@pytest.mark.parametrize("path", modules(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_no_module_over_800_lines_and_no_function_over_80_code_lines(path):
    relative = str(path.relative_to(PACKAGE))
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    if relative not in LONG_MODULES_ALLOWED:
        assert len(lines) <= MAX_MODULE_LINES, f"{relative}: {len(lines)} lines"
    long = [(node.name, code_lines(lines, node)) for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and code_lines(lines, node) > MAX_FUNCTION_CODE_LINES]
    assert not long, f"{relative}: {long}"
