"""The package's layout (docs/development.md, "Layout"): leaf modules that many others import
(names, limits, options, atomic writes) import neither TensorFlow nor Keras, nor any project
module but the config and constants. Reads the source with `ast` and imports nothing heavy."""

import ast
import pathlib
import subprocess
import sys

import pytest
from helpers import import_log

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEAVY = {"tensorflow", "keras", "tensorflow_text", "ctranslate2", "spacy", "numpy", "sentencepiece"}
# The project modules a leaf module may import (themselves leaves).
LEAF_MAY_IMPORT = {"keras_transformer.config", "keras_transformer.constants"}
# Modules that many others import and that must stay leaves.
LEAF_MODULES = ("export.signatures",)


def module_path(name: str) -> pathlib.Path:
    path = ROOT.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imported_names(path: pathlib.Path) -> set[str]:
    """Every module an `import` or `from ... import` of `path` names, wherever it stands
    (inside functions and `if typing.TYPE_CHECKING:` blocks too); relative imports resolved."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
    return names


@pytest.mark.parametrize("name", LEAF_MODULES)
def test_a_leaf_module_imports_the_standard_library_and_the_config_at_most(name):
    outside = sorted(imported for imported in imported_names(module_path(name))
                     if imported.partition(".")[0] not in sys.stdlib_module_names and imported != "__future__"
                     and imported not in LEAF_MAY_IMPORT)
    assert outside == [], f"{name} imports {', '.join(outside)}: a leaf module imports the standard library, " \
                          f"{' and '.join(sorted(LEAF_MAY_IMPORT))} only"


@pytest.mark.parametrize("name", LEAF_MODULES)
def test_importing_a_leaf_module_loads_neither_tensorflow_nor_keras(name):
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {name}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    imported, errors = import_log(result.stderr)
    assert result.returncode == 0, errors
    assert name in imported
    assert not HEAVY & imported, f"importing {name} loads {sorted(HEAVY & imported)}"
