"""The docs' generated reference pages, and the check that the docs' commands are real.

    python -m tools.reference           # writes docs/reference/options.md and commands.md
    python -m tools.reference --check   # exit 1 if a page is stale or a documented command is not real

* `docs/reference/options.md`: `train.py`'s options, made from the option definitions on
  the config fields (`keras_transformer.config.options_table`), the fields `--set` takes, and
  the decoding options' table and what each does (`keras_transformer.decoding.options.markdown_table`,
  `markdown_details`).
* `docs/reference/commands.md`: every command (`train.py`, `python -m export.*`,
  `python -m keras_transformer.parsing`, `python -m benchmarks.*`) from its argparse parser:
  the module's `build_parser()` where it has one, else the parser its `main` builds (caught
  at its first `parse_args`, before it runs anything).
* `--check` also reads every fenced `bash` block of README.md and docs/ (the dated archive
  docs/lab-notebook/ aside) and checks that each `python -m MODULE` names a module that exists
  and each `--flag` given to it or to `train.py` is one of that command's flags.

Rendering uses the parsers' actions, not `format_help()`, whose layout changes between
Python versions. It is one of the project's commands (`keras_transformer.console`): quiet, and
the command modules' parsers load without TensorFlow; the benchmarks' modules import it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import io
import pathlib
import re
import shlex
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
OPTIONS_PAGE = DOCS / "reference" / "options.md"
COMMANDS_PAGE = DOCS / "reference" / "commands.md"
# The developers' benchmark commands: a page of their own, so that a user's command list is the product's.
BENCHMARKS_PAGE = DOCS / "reference" / "benchmark-commands.md"
USAGE_WIDTH = 100
ARCHIVE = "lab-notebook"  # docs/lab-notebook/: dated, kept as written, not checked

# The commands in the order the reference gives them; benchmarks follow, found on disk.
COMMANDS = ("train", "export.saved_model", "export.translate", "export.tflite", "export.ctranslate2",
            "export.op_audit", "export.saved_model_cli", "keras_transformer.parsing", "tools.reference")
# The project's packages: their modules run with `python -m` must be commands listed here.
PROJECT_PACKAGES = ("export", "keras_transformer", "benchmarks", "tools")
# Commands whose parser is not ours: documented by a sentence, their flags not checked.
FOREIGN_PARSERS = {
    "export.saved_model_cli": "TensorFlow's own `saved_model_cli` (its arguments unchanged: `show`, `run`, "
                              "`--dir`, `--tag_set`, `--signature_def`, `--input_exprs`, ...; "
                              "`python -m export.saved_model_cli --help`), run with tensorflow-text's ops "
                              "registered, quiet unless `--verbose`, and answering a directory that holds "
                              "no SavedModel in one line.",
}
FOREIGN_SUMMARIES = {"export.saved_model_cli": "TensorFlow's `saved_model_cli` with tensorflow-text's ops registered"}
# Modules of benchmarks/ that are no command.
NOT_COMMANDS = ("benchmarks.__init__", "benchmarks.harness")


class _Captured(Exception):
    """Raised by the patched `parse_args` to hand the parser back."""


def command_modules() -> list[str]:
    """Every command's module name: the fixed ones, then each benchmarks/ script with a `main`."""
    benchmarks = sorted(f"benchmarks.{path.stem}" for path in (ROOT / "benchmarks").glob("*.py")
                        if re.search(r"^def main\(", path.read_text(encoding="utf-8"), re.M))
    return [*COMMANDS, *(name for name in benchmarks if name not in NOT_COMMANDS)]


def invocation(module: str) -> str:
    """What a user types: `python train.py`, `python -m export.translate`."""
    return "python train.py" if module == "train" else f"python -m {module}"


@functools.cache
def parser_of(module: str) -> argparse.ArgumentParser:
    """The command's complete parser: `build_parser()`, or the one `main([])` builds, caught
    at its first `parse_args`/`parse_known_args` (nothing after that runs)."""
    imported = importlib.import_module(module)
    if hasattr(imported, "build_parser"):
        return imported.build_parser()

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = capture
    try:
        imported.main([])
    except _Captured as captured:
        return captured.args[0]
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
    raise RuntimeError(f"{module}.main([]) returned without parsing arguments")


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _help(action: argparse.Action, prog: str) -> str:
    if not action.help:
        return ""
    text = " ".join(action.help.split())
    if "%(" in text:
        text = text % {**vars(action), "prog": prog, "default": action.default}
    return text.replace("%%", "%")


def _metavar(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None and not action.option_strings:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.required or action.default in (None, argparse.SUPPRESS, [], ""):
        return ""
    return f"`{action.default}`"


def _shown(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's actions that `--help` shows (not `-h` itself, nor `help=SUPPRESS`)."""
    return [action for action in parser._actions
            if not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS]


def _usage(parser: argparse.ArgumentParser, command: str) -> str:
    parts = [command]
    for action in _shown(parser):
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            if isinstance(action, argparse._SubParsersAction):
                parts.append("{" + ",".join(action.choices) + "} ...")
            continue
        metavar = _metavar(action)
        if not action.option_strings:
            text = metavar if action.nargs not in ("?", "*") else f"[{metavar}]"
            parts.append(text)
            continue
        text = action.option_strings[-1] + (f" {metavar}" if metavar else "")
        parts.append(text if action.required else f"[{text}]")
    lines, line = [], ""
    for part in parts:  # wrapped between arguments, never inside one
        if line and len(line) + 1 + len(part) > USAGE_WIDTH:
            lines.append(line)
            line = "    " + part
        else:
            line = f"{line} {part}" if line else part
    return "\n".join([*lines, line])


def _description(parser: argparse.ArgumentParser, module: str) -> str:
    """The first paragraph of the parser's description, else of the module's docstring."""
    text = parser.description or (importlib.import_module(module).__doc__ or "")
    first = text.strip().split("\n\n")[0]
    return " ".join(first.split())


def _arguments_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | default | what it does |", "|---|---|---|"]
    for action in _shown(parser):
        if isinstance(action, argparse._SubParsersAction):
            continue
        metavar = _metavar(action)
        names = ", ".join(action.option_strings) or action.dest
        argument = f"{names} {metavar}".strip() if action.option_strings else metavar
        choices = f" (one of: {', '.join(map(str, action.choices))})" if action.choices and action.option_strings else ""
        required = " Required." if action.required and action.option_strings else ""
        rows.append(f"| `{_cell(argument)}` | {_cell(_default(action))} | "
                    f"{_cell(_help(action, parser.prog) + choices + required)} |")
    return rows if len(rows) > 2 else []


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_section(module: str) -> list[str]:
    command = invocation(module)
    lines = [f"## `{command}`", ""]
    if module in FOREIGN_PARSERS:
        return [*lines, FOREIGN_PARSERS[module], ""]
    parser = parser_of(module)
    description = _description(parser, module)
    if description:
        lines += [description, ""]
    lines += ["```text", _usage(parser, command), "```", ""]
    table = _arguments_table(parser)
    lines += [*table, ""] if table else []
    for name, sub in _subparsers(parser).items():
        lines += [f"### `{command} {name}`", ""]
        sub_description = _description(sub, module) if sub.description else ""
        lines += [sub_description, ""] if sub_description else []
        lines += ["```text", _usage(sub, f"{command} {name}"), "```", ""]
        table = _arguments_table(sub)
        lines += [*table, ""] if table else []
    return lines


GENERATED = "<!-- Generated by `python -m tools.reference`: edit the parsers or option definitions, not this page. -->"


def _command_table(modules: list[str]) -> list[str]:
    lines = ["| command | what it does |", "|---|---|"]
    for module in modules:
        summary = (FOREIGN_SUMMARIES.get(module) or _description(parser_of(module), module)).split(". ")[0]
        summary = summary.rstrip(".")
        anchor = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", invocation(module)).strip().lower())  # MkDocs' slug
        lines.append(f"| [`{invocation(module)}`](#{anchor}) | {_cell(summary)} |")
    return lines + [""]


def _as_docs_say(page: str) -> str:
    """Defaults computed from the checkout's place (`benchmarks.harness.SHARED_DATA`), and the
    help texts that name that folder, as the docs say them: `DATA`, the same in every clone."""
    return (page.replace(str(ROOT.parent / "shared" / "data"), "DATA").replace("../shared/data", "DATA")
            .replace(str(ROOT) + "/", ""))


def commands_page() -> str:
    project = [m for m in command_modules() if not m.startswith("benchmarks.")]
    lines = ["# Commands", "", GENERATED, "",
             "Every command of the project and its arguments, made from its argparse parser. Run a "
             "command from the repository root; `--help` prints the same. `train.py`'s options are "
             "explained in [Options](options.md). The developers' benchmarks, which measure the project "
             "rather than use it, have [their own page](benchmark-commands.md).", ""]
    lines += _command_table(project)
    for module in project:
        lines += command_section(module)
    return _as_docs_say("\n".join(lines).rstrip("\n") + "\n")


def benchmarks_page() -> str:
    benchmarks = [m for m in command_modules() if m.startswith("benchmarks.")]
    lines = ["# Benchmark commands", "", GENERATED, "",
             "The developers' benchmarks and their arguments, made from their argparse parsers: they "
             "measure the project (speed, memory, parity, quality) rather than use it. Each is a module of "
             "`benchmarks/`, sharing `benchmarks/harness.py`, run from the repository root; its results are "
             "in [Benchmarks](../benchmarks.md). A default written `DATA/...` is read from the folder "
             "`shared/data` beside the checkout (`benchmarks.harness.SHARED_DATA`), a directory of the text "
             "files described in [Data](../data.md); name your own with the flag. The product's commands "
             "are in [Commands](commands.md).", ""]
    lines += _command_table(benchmarks)
    for module in benchmarks:
        lines += command_section(module)
    return _as_docs_say("\n".join(lines).rstrip("\n") + "\n")


def options_page() -> str:
    from keras_transformer.decoding import options as decoding_options
    from keras_transformer.config import MODEL_OVERRIDE_FIELDS, options_table

    fields = ", ".join(f"`{name}`" for name in MODEL_OVERRIDE_FIELDS)
    return "\n".join([
        "# Options", "", GENERATED, "",
        "`python train.py --help` explains each option, and answers at once: nothing imports "
        "TensorFlow before the flags are read. Each option is defined once, on its field in "
        "`keras_transformer/config.py` (name, type, allowed values, help); the default of each preset "
        "comes from `TrainingConfig.create`. A misused flag is reported in one line naming it "
        "(`train.py: error: --steps must be a positive integer, got 0`).", "",
        "<!-- options:begin -->", options_table(), "<!-- options:end -->", "",
        "Besides these:", "",
        "- `--no-export`: skip the SavedModel export at the end;",
        "- `--verbose`: show TensorFlow's and Keras's own log lines and warnings too;",
        "- `--set FIELD=VALUE` (repeatable): any other model field on top of the preset, e.g. "
        "`--set dropout=0.3 --set num_layers=4`. The fields: " + fields + "; each is documented in "
        "[`TransformerConfig`](../api.md#keras_transformer.config.TransformerConfig). `num_decoder_layers` "
        "gives the decoder a depth of its own (unset, both stacks have `num_layers`).", "",
        "The syntax options are explained in [Syntax-aware models](../syntax.md).", "",
        "## Decoding options", "",
        "Each decoding option is one row of `keras_transformer/decoding/options.py` (name, type, default, "
        "the values Python and a served request take, CTranslate2's name, `export.translate`'s flag, the "
        "signatures that take it): `SearchOptions` and `Translator.translate` raise on a bad value, "
        "`translate_options` and `translate_advanced` clip it or answer the sentence with an error, "
        "`export.translate` refuses its flag.", "",
        "<!-- decoding-options:begin -->", decoding_options.markdown_table(), "<!-- decoding-options:end -->", "",
        "## What each decoding option does", "",
        "In `SearchOptions`' words (its docstring's Args are made from the same rows); "
        "`Translator.translate` takes the same names, and the signatures and `export.translate` the "
        "served forms above.", "",
        decoding_options.markdown_details()])


# -- the docs' commands ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DocumentedCommand:
    path: str  # the Markdown file, relative to the repository root
    line: int
    module: str  # "train" for train.py
    arguments: tuple[str, ...]


def documents() -> list[pathlib.Path]:
    """README.md and docs/**/*.md but the dated archive."""
    return [ROOT / "README.md", *sorted(path for path in DOCS.rglob("*.md") if ARCHIVE not in path.parts)]


def _bash_blocks(text: str):
    """(first line number, lines) of each fenced bash/sh/shell block."""
    start, block, fence, shell = None, [], None, False
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if fence is None:
            match = re.match(r"^(```+|~~~+)\s*(\w*)", stripped)
            if match:
                fence, start, block = match.group(1), number + 1, []
                shell = match.group(2) in ("bash", "sh", "shell", "console")
        elif stripped.startswith(fence):
            if shell:
                yield start, block
            fence = None
        else:
            block.append(line)


def _commands_in(lines: list[str], first: int):
    """(line number, tokens) of each shell command in a block, continuation lines joined."""
    joined, at = "", None
    for number, line in enumerate(lines, first):
        at = number if at is None else at  # where the command starts
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        text, command_line, joined, at = joined + line, at, "", None
        text = "" if text.lstrip().startswith("#") else text.split(" #", 1)[0]  # before splitting at | ; &&
        for piece in re.split(r"&&|\|\||;|\|(?!\|)", text):
            try:
                tokens = shlex.split(piece, comments=True)
            except ValueError:
                tokens = piece.split()
            if tokens:
                yield command_line, tokens


def documented_commands() -> list[DocumentedCommand]:
    """Each `python -m MODULE ...` and `python train.py ...` of the docs' bash blocks."""
    found = []
    for path in documents():
        for first, block in _bash_blocks(path.read_text(encoding="utf-8")):
            for number, tokens in _commands_in(block, first):
                for index, token in enumerate(tokens):
                    if token not in ("python", "python3") and not token.endswith("/python"):
                        continue
                    rest = tokens[index + 1:]
                    if rest[:1] == ["-m"] and len(rest) > 1:
                        module, arguments = rest[1], rest[2:]
                    elif rest[:1] == ["train.py"]:
                        module, arguments = "train", rest[1:]
                    else:
                        continue
                    arguments = tuple(a for a in arguments if a not in ("<", ">") and not a.startswith((">", "<")))
                    found.append(DocumentedCommand(path.relative_to(ROOT).as_posix(), number, module, arguments))
    return found


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its package does not exist
        return False


def command_problems() -> list[str]:
    """What is wrong with the docs' commands: a module that does not exist, a flag its
    command does not take (a subcommand's flags are its own)."""
    problems = []
    for command in documented_commands():
        where = f"{command.path}:{command.line}"
        if command.module != "train" and not _module_exists(command.module):
            problems.append(f"{where}: python -m {command.module}: no such module")
            continue
        if command.module != "train" and command.module.split(".")[0] not in PROJECT_PACKAGES:
            continue  # another tool (pip, pytest, ...): it exists; its flags are its own
        if command.module not in command_modules():
            problems.append(f"{where}: python -m {command.module} is not one of the project's commands")
            continue
        if command.module in FOREIGN_PARSERS:
            continue
        parser = parser_of(command.module)
        subcommands = _subparsers(parser)
        positional = [a for a in command.arguments if not a.startswith("-")]
        if subcommands and positional and positional[0] in subcommands:
            parser = subcommands[positional[0]]
        elif subcommands:
            problems.append(f"{where}: {invocation(command.module)} needs one of {', '.join(subcommands)}")
            continue
        known = _option_strings(parser)
        for argument in command.arguments:
            flag = argument.split("=", 1)[0]
            if flag.startswith("--") and flag not in known:
                problems.append(f"{where}: {invocation(command.module)} has no flag {flag}")
    return problems


def pages() -> dict[pathlib.Path, str]:
    return {OPTIONS_PAGE: options_page(), COMMANDS_PAGE: commands_page(), BENCHMARKS_PAGE: benchmarks_page()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a page is stale or a documented command or flag is not real")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    with contextlib.redirect_stdout(io.StringIO()):  # a benchmark's main may print before it parses
        generated = pages()
    if not args.check:
        for path, text in generated.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    problems = [f"{path.relative_to(ROOT)} is not what `python -m tools.reference` writes: run it"
                for path, text in generated.items()
                if not path.exists() or path.read_text(encoding="utf-8") != text]
    problems += command_problems()
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
