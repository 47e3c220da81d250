"""The suite's own markers: a `@pytest.mark.X` reaches pytest only on a test (a `test_*`
function or a `Test*` class). On any other function pytest ignores it without a word: a
move of the translate_speed smoke test once left its `slow` marker on the helper above it,
and `-m "not slow"` then ran that test. Reads the test files with `ast`."""

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent


def _is_mark(decorator: ast.expr) -> bool:
    """`@pytest.mark.X` or `@pytest.mark.X(...)`."""
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark" and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "pytest")


def misplaced_marks(source: str) -> list[str]:
    """`"name (line N)"` of each function or class of `source` that carries a pytest mark
    but is not a test pytest collects."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            is_test = node.name.startswith("Test" if isinstance(node, ast.ClassDef) else "test")
            if not is_test and any(_is_mark(d) for d in node.decorator_list):
                found.append(f"{node.name} (line {node.lineno})")
    return found


def test_the_checker_flags_a_marked_helper_and_passes_marked_tests():
    source = ("import pytest\n"
              "@pytest.mark.slow\ndef _tables(out):\n    pass\n"
              "@pytest.mark.slow\ndef test_a():\n    pass\n"
              "@pytest.mark.parametrize('x', [1])\ndef test_b(x):\n    pass\n"
              "@pytest.mark.slow\nclass TestC:\n    pass\n"
              "@pytest.fixture\n@pytest.mark.slow\ndef run():\n    pass\n")
    assert misplaced_marks(source) == ["_tables (line 3)", "run (line 16)"]


def test_every_pytest_mark_in_the_suite_is_on_a_test():
    found = {path.relative_to(TESTS).as_posix(): misplaced_marks(path.read_text(encoding="utf-8"))
             for path in sorted(TESTS.rglob("*.py"))}
    assert not {path: names for path, names in found.items() if names}
