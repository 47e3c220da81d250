"""The commands' `--help` and flag errors answer before anything imports TensorFlow, Keras,
tensorflow-text, CTranslate2 or spaCy (their start-up took 5-7 s of each `--help` on a 2-vCPU
EPYC), and each command module's `build_parser()` is the whole command line that its `main`
parses (the command reference is made from it)."""

import argparse
import importlib
import pathlib
import re
import subprocess
import sys
import typing

import pytest
from helpers import import_log

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEAVY = {"tensorflow", "keras", "tensorflow_text", "ctranslate2", "spacy"}


class Command(typing.NamedTuple):
    """One command (its `prog`, the key in `COMMANDS`)."""

    run: list  # the interpreter's arguments that start it
    module: str  # the module of its `build_parser` and `main`
    flags: tuple  # what its help names
    misuse: list  # a command line that argparse refuses ...
    error: str  # ... and the start of its one-line error
    typical: list  # a command line it takes


COMMANDS = {
    "train.py": Command(
        [str(ROOT / "train.py")], "train",
        ("--config", "--data", "--model-dir", "--steps", "--batch-tokens", "--average", "--set", "--no-export"),
        ["--steps", "x"], "train.py: error: argument --steps: invalid int value: 'x'",
        ["--config", "tiny", "--steps", "30", "--model-dir", "runs/t", "--set", "dropout=0.2", "--no-export"]),
    "export.saved_model": Command(
        ["-m", "export.saved_model"], "export.saved_model",
        ("--model-dir", "--output", "--version", "--xla-warmup", "--patience", "--average", "--verbose"),
        ["--model-dir", "m", "--output", "o", "--version", "x"],
        "export.saved_model: error: argument --version: invalid int value: 'x'",
        ["--model-dir", "m", "--output", "o", "--patience", "2", "--average", "3"]),
    "export.translate": Command(
        ["-m", "export.translate"], "export.translate",
        ("--saved-model", "--beam-size", "--alpha", "--n-best", "--patience", "--batch-size", "--xla", "--no-xla"),
        ["--saved-model", "e", "--xla", "--no-xla"],
        "export.translate: error: argument --no-xla: not allowed with argument --xla",
        ["--saved-model", "e/1", "--beam-size", "5", "--n-best", "2", "--alpha", "0.8"]),
    "export.tflite": Command(
        ["-m", "export.tflite"], "export.tflite", ("--saved-model", "--output", "--quantize", "--translate"),
        ["--saved-model", "e", "--output", "m.tflite", "--quantize", "int4"],
        "export.tflite: error: argument --quantize: invalid choice: 'int4'",
        ["--saved-model", "e/1", "--output", "m.tflite", "--quantize", "float16", "--translate"]),
    "export.ctranslate2": Command(
        ["-m", "export.ctranslate2"], "export.ctranslate2",
        ("--model-dir", "--output", "--quantization", "int8_float16", "--force", "--average"),
        ["--model-dir", "m", "--output", "o", "--quantization", "int4"],
        "export.ctranslate2: error: argument --quantization: invalid choice: 'int4'",
        ["--model-dir", "m", "--output", "o", "--quantization", "int8", "--force"]),
    "export.op_audit": Command(
        ["-m", "export.op_audit"], "export.op_audit", ("saved_model", "--tflite"),
        ["e/1", "--bogus"], "export.op_audit: error: unrecognized arguments: --bogus",
        ["e/1", "--tflite", "m.tflite"]),
    "keras_transformer.parsing": Command(
        ["-m", "keras_transformer.parsing"], "keras_transformer.parsing", ("train", "evaluate", "corpus", "sentences"),
        ["train", "--treebank", "t", "--output", "o", "--seed", "x"],
        "keras_transformer.parsing train: error: argument --seed: invalid int value: 'x'",
        ["corpus", "--parser", "p", "--data", "d", "--output", "o", "--target-lang", "fr"]),
    "benchmarks.ctranslate2_parity": Command(
        ["-m", "benchmarks.ctranslate2_parity"], "benchmarks.ctranslate2_parity",
        ("--run-dir", "--sentences", "--references", "--count", "--label", "--min-length", "--results", "--no-write"),
        ["--run-dir", "r", "--count", "0"],
        "benchmarks.ctranslate2_parity: error: --count must be a positive integer, got 0",
        ["--run-dir", "r", "--count", "50", "--label", "a run", "--no-write"]),
}
# `python -m keras_transformer.parsing SUBCOMMAND --help`: the flags each names.
PARSING_SUBCOMMANDS = {
    "train": ("--treebank", "--output", "--max-minutes", "--seed", "--max-steps"),
    "evaluate": ("--parser", "--conllu"),
    "corpus": ("--parser", "--data", "--output", "--source-lang", "--target-lang"),
    "sentences": ("--parser",),
}


def run_logging_imports(*args):
    """`python -X importtime ARGS` in the repository root: `(exit status, stdout, the
    modules imported, the other lines of stderr)`."""
    result = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL)
    imported, errors = import_log(result.stderr)
    return result.returncode, result.stdout, imported, errors


def names(flag, text):
    """Whether `text` names `flag` as a word of its own (`--xla` is not in `--xla-warmup`)."""
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


@pytest.mark.parametrize("name", COMMANDS)
def test_help_names_the_flags_without_importing_tensorflow(name):
    command = COMMANDS[name]
    code, stdout, imported, errors = run_logging_imports(*command.run, "--help")
    assert code == 0 and errors == [], errors
    assert stdout.startswith(f"usage: {name} "), stdout[:200]
    assert [flag for flag in command.flags if not names(flag, stdout)] == []
    assert not HEAVY & imported, sorted(HEAVY & imported)
    assert "keras_transformer.console" in imported  # (the log is the interpreter's: it names what ran)


@pytest.mark.parametrize("subcommand", PARSING_SUBCOMMANDS)
def test_a_parsing_subcommands_help_names_its_flags_without_importing_spacy(subcommand):
    code, stdout, imported, errors = run_logging_imports("-m", "keras_transformer.parsing", subcommand, "--help")
    assert code == 0 and errors == [], errors
    assert stdout.startswith(f"usage: keras_transformer.parsing {subcommand} "), stdout[:200]
    assert [flag for flag in PARSING_SUBCOMMANDS[subcommand] if not names(flag, stdout)] == []
    assert not HEAVY & imported, sorted(HEAVY & imported)


@pytest.mark.parametrize("name", COMMANDS)
def test_a_flag_error_is_one_line_without_importing_tensorflow(name):
    command = COMMANDS[name]
    code, stdout, imported, errors = run_logging_imports(*command.run, *command.misuse)
    assert code == 2 and stdout == ""
    assert len(errors) == 1 and errors[0].startswith(command.error) and errors[0].endswith(" (see --help)"), errors
    assert not HEAVY & imported, sorted(HEAVY & imported)


def test_every_build_parser_is_made_without_tensorflow():
    """A fresh interpreter imports each command module and formats its `build_parser()`'s
    help without importing any of `HEAVY`. It is made one of the project's commands first
    (`console.running_command` reads `sys.orig_argv`): in a library user's program, `import
    keras_transformer` binds every name at once, Keras and TensorFlow included."""
    code = ("import importlib, sys\n"
            "sys.orig_argv = [sys.executable, '-m', 'export.op_audit']\n"
            f"for name in {[command.module for command in COMMANDS.values()]!r}:\n"
            "    assert importlib.import_module(name).build_parser().format_help().startswith('usage: ')\n"
            f"print(sorted({HEAVY!r} & set(sys.modules)))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "[]\n"


def test_translate_info_reads_the_export_record_without_tensorflow(tmp_path):
    """`export.translate --info` prints an export's record from its JSON alone: no TensorFlow
    is imported and the SavedModel is not read (an empty `saved_model.pb` stands for it)."""
    import json

    from keras_transformer.config import TransformerConfig

    version = tmp_path / "export" / "3"
    (version / "assets.extra").mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"")
    record = {"keras_transformer_version": "9.8.7", "tensorflow_version": "2.21.0",
              "signatures": ["serving_default", "score"], "config": TransformerConfig().to_dict(), "patience": 2.0}
    (version / "assets.extra" / "keras_transformer.json").write_text(json.dumps(record))
    code, stdout, imported, errors = run_logging_imports("-m", "export.translate", "--saved-model",
                                                         str(tmp_path / "export"), "--info")
    assert code == 0 and errors == [], errors
    assert stdout.splitlines() == [
        f"export: {version}", "keras_transformer_version: 9.8.7", "tensorflow_version: 2.21.0",
        "signatures: serving_default, score",
        "model: vocab_size=37000, num_layers=6, num_decoder_layers=None, d_model=512, d_ff=2048, num_heads=8, "
        "max_length=256, norm_first=False",
        "decoding: beam_size=4, length_penalty_alpha=0.6, decode_extra_length=50", "patience: 2.0"]
    assert not HEAVY & imported, sorted(HEAVY & imported)


class _Parsed(Exception):
    """Ends a command's `main` right after it parsed its command line."""


@pytest.mark.parametrize("name", COMMANDS)
def test_build_parser_is_the_parser_main_uses(name, monkeypatch):
    """`build_parser().parse_args(ARGS)` is the namespace the command's `main(ARGS)` parses
    (its `main` is stopped right there): the help made from `build_parser` describes the
    command that runs."""
    command = COMMANDS[name]
    module = importlib.import_module(command.module)
    expected = vars(module.build_parser().parse_args(command.typical))
    parse_args, parsed = argparse.ArgumentParser.parse_args, []

    def parsed_then_stop(parser, args=None, namespace=None):
        parsed.append(vars(parse_args(parser, args, namespace)))
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parsed_then_stop)
    with pytest.raises(_Parsed):
        module.main(command.typical)
    assert parsed == [expected]


def test_the_help_offers_the_quantizations_ctranslate2_accepts():
    """`export.ctranslate2.QUANTIZATIONS` is written out so that `--help` needs no CTranslate2:
    it is CTranslate2's own list."""
    pytest.importorskip("ctranslate2")
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    from export.ctranslate2 import QUANTIZATIONS

    assert QUANTIZATIONS == ACCEPTED_MODEL_TYPES


def test_the_data_packages_lazy_names_are_its_eager_names():
    """The project's commands get `keras_transformer.data`'s names on first use (`_MODULES` says
    where each lives), so that `keras_transformer.parsing` imports `data.syntax` without
    TensorFlow; a library user's import binds them at once: the same objects."""
    from keras_transformer import data

    assert sorted(data._MODULES) == sorted(data.__all__)
    for name, module in data._MODULES.items():
        lazy = getattr(importlib.import_module(f"keras_transformer.data.{module}"), name)
        assert lazy is getattr(data, name), name
