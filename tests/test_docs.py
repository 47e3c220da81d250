"""The documentation stays true: its generated pages are what the parsers and option
definitions make, every command and flag in its shell blocks is real, and the README stays a
short entry point. (The Python examples run as tests too: conftest.py at the root, Sybil.)"""

import pathlib
import re
import subprocess
import sys

import pytest

from benchmarks.report import MACHINE_PATH, README_BEGIN, README_END
from tools import reference

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_generated_pages_are_current_and_every_documented_command_and_flag_is_real():
    """`python -m tools.reference --check` in a process of its own (the benchmarks' modules
    import TensorFlow, and their parsers are caught from their `main`): it prints one line per
    stale page or unknown module or flag, naming the file and line."""
    done = subprocess.run([sys.executable, "-m", "tools.reference", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def _problems_of(tmp_path, monkeypatch, markdown):
    page = tmp_path / "page.md"
    page.write_text(markdown, encoding="utf-8")
    monkeypatch.setattr(reference, "ROOT", tmp_path)
    monkeypatch.setattr(reference, "documents", lambda: [page])
    return reference.command_problems()


def test_the_check_names_an_unknown_flag_module_or_subcommand_with_its_line(tmp_path, monkeypatch):
    """A wrong flag after a continuation line, a flag of the command after a pipe, a module
    that does not exist and a flag of another command are each named with the file and the
    line where the command starts; correct commands, comments and other languages' blocks pass."""
    markdown = "\n".join([
        "# A page", "",
        "```bash",
        "python train.py --config multi30k --data ../shared/data/multi30k \\",   # line 4
        "    --model-dir runs/x --stepz 10",
        "echo hello | python train.py --steps 3 --max-minutes 0  # --not-a-flag in a comment",
        "python -m export.no_such_command --help",                              # line 7
        "python train.py --saved-model runs/x",                                 # line 8: export.translate's flag
        "python -m pytest -q",                                                  # another tool: exists, not checked
        "python -m no_such_tool",                                               # line 10
        "```", "",
        "```text", "python train.py --not-checked-in-text", "```", "",
    ])
    problems = _problems_of(tmp_path, monkeypatch, markdown)
    assert problems == [
        "page.md:4: python train.py has no flag --stepz",
        "page.md:7: python -m export.no_such_command: no such module",
        "page.md:8: python train.py has no flag --saved-model",
        "page.md:10: python -m no_such_tool: no such module",
    ]


def test_the_check_reads_each_subcommand_with_its_own_flags(tmp_path, monkeypatch):
    """`keras_transformer.parsing` has subcommands: a flag is checked against the subcommand's
    parser, and a call without a subcommand is named."""
    markdown = "\n".join([
        "```bash",
        "python -m keras_transformer.parsing train --treebank ../shared/data/ud-ewt --output runs/p",
        "python -m keras_transformer.parsing evaluate --parser runs/p --treebank x",   # line 3: train's flag
        "python -m keras_transformer.parsing --parser runs/p",                          # line 4
        "```"])
    problems = _problems_of(tmp_path, monkeypatch, markdown)
    assert problems == [
        "page.md:3: python -m keras_transformer.parsing has no flag --treebank",
        "page.md:4: python -m keras_transformer.parsing needs one of train, evaluate, corpus, sentences",
    ]


def test_the_reference_renders_a_parser_as_its_flags_defaults_and_help():
    """The commands page's rendering of a parser (not `format_help`, whose layout moves
    between Python versions): usage wrapped between arguments, a row per argument with its
    default and choices, `|` escaped."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m demo", description="Demo. More text.\n\nSecond paragraph.")
    parser.add_argument("source", help="a file")
    parser.add_argument("--beam-size", type=int, default=4, help="beam (default: %(default)s)")
    parser.add_argument("--quantize", choices=("none", "int8"), default="none", help="a|b")
    parser.add_argument("--output", required=True, help="where")
    parser.add_argument("--verbose", action="store_true", help="louder")
    rows = reference._arguments_table(parser)
    assert rows[2:] == [
        "| `source` |  | a file |",
        "| `--beam-size BEAM_SIZE` | `4` | beam (default: 4) |",
        "| `--quantize QUANTIZE` | `none` | a\\|b (one of: none, int8) |",
        "| `--output OUTPUT` |  | where Required. |",
        "| `--verbose` |  | louder |",
    ]
    assert reference._usage(parser, "python -m demo") == (
        "python -m demo source [--beam-size BEAM_SIZE] [--quantize QUANTIZE] --output OUTPUT [--verbose]")
    assert reference._description(parser, "argparse") == "Demo. More text."


def test_the_readme_is_a_short_entry_point():
    """Issue #85: at most 250 lines; install, training on your own data, and translating and
    serving start within the first 150; no dates but the figures' own in the generated results
    table (the rest belong with the figures, in docs/)."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").split("\n")
    assert len(lines) <= 250, len(lines)
    headings = {line: number for number, line in enumerate(lines, 1) if line.startswith("## ")}
    for heading in ("## Install", "## Quick start", "## Train on your own data", "## Translate and serve"):
        assert headings[heading] <= 150, (heading, headings[heading])
    text = "\n".join(lines)
    results = text[text.index(README_BEGIN):text.index(README_END)]  # its figures' dates and commits
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text.replace(results, ""))


@pytest.mark.parametrize("text, found", [
    ("python train.py --data /work/shared/data/multi30k", "/work/"),
    ("--model-dir /tmp/s79/runs/multi30k", "/tmp/"),
    ("python train.py --data ../shared/data/multi30k", "../shared"),
    ("cat ../../shared/docs/STYLE.md", "../../shared"),
    ("--output=/home/me/export", "/home/"),
    ("a cache in /root/.cache/pip", "/root/"),
    ("python train.py --data DATA/multi30k --model-dir runs/tmp/x", None),
    ("/usr/bin/time -v python -m pytest -q", None),
    ("none of its files left in `/tmp`", None),
])
def test_a_machine_path_is_a_path_of_one_machine(text, found):
    """`benchmarks.report.MACHINE_PATH`, which the next test and the results' schema check use:
    one machine's work, temporary, home and data folders, not a relative path nor a system tool."""
    match = MACHINE_PATH.search(text)
    assert (match.group(0) if match else None) == found


def test_the_docs_name_no_path_of_one_machine():
    """Issue #92: README.md and docs/ (the dated archive docs/lab-notebook/ aside) name no path
    that only one machine has (its data folder, `/tmp` run folders, home): a command says
    `DATA/multi30k`, `RUN`, `EXPORT` or a relative `runs/...` instead, as the page using it
    says."""
    hits = [f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
            for path in reference.documents()
            for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1)
            for match in MACHINE_PATH.finditer(line)]
    assert hits == []


@pytest.mark.parametrize("link", sorted(set(re.findall(
    r"\]\(((?:docs/)[^)#\s]+)", (ROOT / "README.md").read_text(encoding="utf-8")))))
def test_the_readmes_links_into_the_docs_exist(link):
    """The README links to the docs' Markdown files (GitHub shows them; the site is built
    from them): each exists. MkDocs checks the links inside docs/ (`mkdocs build --strict`)."""
    assert (ROOT / link).is_file(), link


# SHA-256 of the Apache License 2.0 as apache.org publishes it (https://www.apache.org/licenses/LICENSE-2.0.txt:
# 202 lines, the first blank), the file of that name in the many packages that ship it verbatim.
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_the_license_is_the_apache_2_0_text_that_pyproject_names_and_ships():
    """Issue #92: LICENSE is the Apache License 2.0, byte for byte, its nine sections and the
    appendix; pyproject.toml names it by its SPDX expression and ships the file."""
    import hashlib
    import tomllib

    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256
    lines = text.decode("ascii").splitlines()
    assert [line.strip() for line in lines[1:4]] == ["Apache License", "Version 2.0, January 2004",
                                                    "http://www.apache.org/licenses/"]
    assert re.findall(r"^   (\d+)\. ", text.decode("ascii"), re.MULTILINE) == [str(n) for n in range(1, 10)]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert (project["license"], project["license-files"]) == ("Apache-2.0", ["LICENSE"])


def test_the_changelogs_newest_release_is_pyprojects_version():
    """Issue #92: CHANGELOG.md (Keep a Changelog) starts with an Unreleased section, then its
    releases newest first, `## [VERSION] - YYYY-MM-DD`; the newest is pyproject.toml's version."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    headings = re.findall(r"^## (.*)$", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.MULTILINE)
    assert headings[0] == "[Unreleased]", headings
    releases = [re.fullmatch(r"\[(\d+\.\d+\.\d+)\] - (\d{4}-\d\d-\d\d)", heading) for heading in headings[1:]]
    assert releases and all(releases), headings
    assert releases[0].group(1) == version
    numbers = [tuple(int(part) for part in release.group(1).split(".")) for release in releases]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(numbers)
