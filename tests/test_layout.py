"""The package's layout (docs/development.md, "Layout"): the project's modules import one
another without a circle, not even lazily inside a function, and the leaf modules that many
others import (names, limits, atomic writes) import neither TensorFlow nor Keras, nor any
project module but the config and constants. Reads the source with `ast`: imports nothing
heavy."""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The project's code: every module of these packages, and the entry-point scripts.
PACKAGES = ("keras_transformer", "export", "benchmarks", "tools")
SCRIPTS = ("train.py",)
HEAVY = {"tensorflow", "keras", "tensorflow_text", "ctranslate2", "spacy", "numpy", "sentencepiece"}
# The project modules a leaf module may import (themselves leaves).
LEAF_MAY_IMPORT = {"keras_transformer.config", "keras_transformer.constants"}
# Modules that many others import and that must stay leaves.
LEAF_MODULES = ("export.signatures", "keras_transformer.atomic_writes")


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, pathlib.Path]:
    """`{module name: path}` of every project module (a package is its `__init__`)."""
    paths = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    return {module_name(path): path for path in paths + [ROOT / script for script in SCRIPTS]}


def _import_nodes(path: pathlib.Path):
    """`(module, names)` of every `import` / `from ... import` of `path`, wherever it stands
    (inside functions and `if typing.TYPE_CHECKING:` blocks too): `names` is None for a plain
    `import`; relative imports are resolved."""
    package = list(path.relative_to(ROOT).with_suffix("").parts[:-1])  # (an __init__'s: its own)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            yield base, [alias.name for alias in node.names]


def imports(path: pathlib.Path) -> set[str]:
    """Every module `path` imports (`from P import N`: `P`)."""
    return {module for module, _ in _import_nodes(path)}


def import_graph() -> dict[str, set[str]]:
    """`{module: the project modules it imports}`. `from P import N` is an edge to the module
    `P.N` where there is one, else to `P` (Python runs a package's `__init__` first as well,
    but that is no edge here: else every submodule would depend on the package that lists it)."""
    modules = project_modules()
    graph = {}
    for name, path in modules.items():
        targets = set()
        for module, names in _import_nodes(path):
            submodules = {f"{module}.{n}" for n in names or ()} & modules.keys()
            targets |= submodules
            if module in modules and (names is None or len(submodules) < len(names)):
                targets.add(module)
        graph[name] = targets - {name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected set of modules (Tarjan), as one circle through it:
    `[a, b, ..., a]` (`strongly_connected` gives all of its modules)."""
    return [_circle_through(graph, component) for component in strongly_connected(graph)]


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The sets of two or more modules that each reach one another (Tarjan), by first name."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(set(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components, key=min)


def _circle_through(graph, component) -> list[str]:
    """A shortest path from the component's first module back to itself, inside it."""
    start = min(component)
    paths, seen = [[start]], set()
    while paths:
        path = paths.pop(0)
        for target in sorted(graph[path[-1]] & component):
            if target == start:
                return path + [start]
            if target not in seen:
                seen.add(target)
                paths.append(path + [target])
    raise AssertionError(f"no circle in {sorted(component)}")


def test_no_import_circle_among_the_projects_modules():
    graph = import_graph()
    components = strongly_connected(graph)
    assert components == [], "import circles (counting imports inside functions): " + "; ".join(
        f"{' -> '.join(_circle_through(graph, component))} (the circle's modules: {', '.join(sorted(component))})"
        for component in components)


def test_the_circle_finder_names_a_circle_and_ignores_a_chain():
    """The checker itself: a circle through three modules is reported in order, a chain and
    a module that imports itself are not circles."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "a"}}
    assert import_circles(graph) == [["a", "b", "c", "a"]]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_import_graph_sees_imports_inside_functions():
    """An import inside a function is an edge: `run_dir.load_trained` imports the checkpoints
    module lazily, and the graph has that edge."""
    graph = import_graph()
    assert "keras_transformer.training.checkpoints" in graph["keras_transformer.run_dir"]
    assert "export.saved_model_graph" in graph["export.saved_model"]


@pytest.mark.parametrize("name", LEAF_MODULES)
def test_a_leaf_module_imports_the_standard_library_and_the_config_at_most(name):
    path = project_modules()[name]
    outside = sorted(imported for imported in imports(path)
                     if imported.partition(".")[0] not in sys.stdlib_module_names and imported != "__future__"
                     and imported not in LEAF_MAY_IMPORT)
    assert outside == [], (f"{name} imports {', '.join(outside)}: a leaf module imports the standard library "
                           f"and {' and '.join(sorted(LEAF_MAY_IMPORT))} only")


@pytest.mark.parametrize("name", LEAF_MODULES)
def test_importing_a_leaf_module_loads_neither_tensorflow_nor_keras(name):
    """In a fresh interpreter made one of the project's commands (`console.running_command`
    reads `sys.orig_argv`: in a library user's program `import keras_transformer` binds every
    public name, Keras included)."""
    code = ("import sys\n"
            "sys.orig_argv = [sys.executable, '-m', 'export.op_audit']\n"
            f"import {name}\n"
            f"print(sorted({HEAVY!r} & set(sys.modules)))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]", f"importing {name} loads {result.stdout.strip()}"


PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_transformer"
MAX_MODULE_LINES = 800
MAX_FUNCTION_CODE_LINES = 80
# The embedded corpus's word lists: data, not code.
LONG_MODULES_ALLOWED = {"keras_transformer/data/embedded.py"}


def modules():
    """Every module of the project's code: the package, export/, benchmarks/, tools/ and train.py."""
    root = PACKAGE.parent
    return sorted([*PACKAGE.rglob("*.py"), *(path for folder in ("export", "benchmarks", "tools")
                                              for path in (root / folder).rglob("*.py")), root / "train.py"])


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
    TensorFlow-only code is `keras_transformer.inference.searcher`'s and `translator`'s."""
    found = []
    for path in sorted((PACKAGE / "decoding").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}: {name}" for name in names if name.split(".")[0] in ("tensorflow", "tensorflow_text")]
    assert not found, found
    assert len(list((PACKAGE / "decoding").glob("*.py"))) >= 8  # (the rule is checked on the package's modules)


# Where `keras_transformer` may import TensorFlow: its TensorFlow-only subpackages, and two
# modules that import it inside a function (the quiet console's import of it; run_dir's
# reading of a checkpoint's state).
TENSORFLOW_PACKAGES = ("data", "training", "inference")
TENSORFLOW_MODULES_ALLOWED = {"console.py", "run_dir.py"}


def test_tensorflow_is_imported_only_by_the_tensorflow_subpackages():
    """The layers, the model, the config and `decoding/` are keras.ops (every backend); the
    TensorFlow-only code is `data/`, `training/` and `inference/` (docs/development.md)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in TENSORFLOW_PACKAGES or str(relative) in TENSORFLOW_MODULES_ALLOWED:
            continue
        found += [f"{relative}: {module}" for module in imports(path)
                  if module.split(".")[0] in ("tensorflow", "tensorflow_text")]
    assert not found, found
    # (the rule reads real imports: the TensorFlow-only subpackages do import it)
    assert any(module.split(".")[0] == "tensorflow" for module in imports(PACKAGE / "inference" / "searcher.py"))


@pytest.mark.parametrize("path", modules(), ids=lambda path: str(path.relative_to(PACKAGE.parent)))
def test_no_module_over_800_lines_and_no_function_over_80_code_lines(path):
    relative = str(path.relative_to(PACKAGE.parent))
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    if relative not in LONG_MODULES_ALLOWED:
        assert len(lines) <= MAX_MODULE_LINES, f"{relative}: {len(lines)} lines"
    long = [(node.name, code_lines(lines, node)) for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and code_lines(lines, node) > MAX_FUNCTION_CODE_LINES]
    assert not long, f"{relative}: {long}"
