"""The current benchmark figures: `docs/benchmarks.md`, generated from `benchmarks/results/*.json`.

    python -m benchmarks.report            # writes docs/benchmarks.md
    python -m benchmarks.report --check    # exit 1 if docs/benchmarks.md differs from what it would write

One result file per question (training speed, Multi30k quality, serving speed, ...), each a
table of the current figures only: a row gives the figure, the command that measured it, the
commit, date and machine, and the lab notebook's section (`docs/lab-notebook/`) that holds its
history. Re-measuring replaces the row in its file; this script makes the page from the files.
The schema of a file (`load_result` checks it and names the file and row of what is wrong):

    {"title": "...", "question": "one sentence", "how": "how it is measured and read",
     "columns": [{"key": "model", "label": "model"}, ...],
     "rows": [{"values": {"model": "...", ...},      # exactly the columns' keys
               "command": "python -m benchmarks....",
               "commit": "54d9a7e",                  # 7-40 hex digits: the code measured, or
               "commit_note": "recorded in",         # (optional) the commit that recorded it
               "date": "2026-12-02",                 # YYYY-MM-DD
               "machine": "2-vCPU AMD EPYC Zen 4 (AVX-512)",    # a label of machines.json
               "notebook": "the exact heading of the lab notebook's section",  # (optional) see below
               "readme": {"what": "...", "figure": "test BLEU {test}"}}]}  # (optional) see below

A command is one anyone can copy: it names no path of the machine it ran on (`/tmp/...`,
`/work/...`, `../shared/...`: `MACHINE_PATH` finds them) but the page's placeholders
(`PLACEHOLDERS`: `DATA/multi30k`, `RUN`, `EXPORT`, `WORK`), which the page's intro defines.
A row's `machine` is a label defined in `benchmarks/results/machines.json`, whose definitions
(processor, CPUs, instruction sets) make the page's "Machines" section:

    {"machines": [{"label": "2-vCPU AMD EPYC Zen 4 (AVX-512)", "processor": "AMD EPYC, family 25
                   model 17 (Zen 4), ...", "cpus": "2 vCPUs", "instructions": "AVX-512 with ...",
                   "note": "one or two sentences"}, ...]}

`notebook` is left out (or null) in a row measured after the notebook was archived
(2026-12-04): such a row's history is its command, commit and date.

A row with `readme` is also a row of the README's "Current results" table (between its
`<!-- results:begin -->` and `<!-- results:end -->` lines): `what`, then `figure` with each
`{column key}` replaced by the row's value, so the README's figures are the page's, then the
row's machine, date and commit.

Pure Python: it imports nothing of TensorFlow (or of the project), so it runs anywhere.
`benchmarks/results/syntax_multi30k.json` is another kind of file (the syntax benchmark's run
records, `benchmarks/syntax.py`) and is not a table of the page.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
README_BEGIN, README_END = "<!-- results:begin -->\n", "<!-- results:end -->"
# The lab notebook, as a link from the page (relative to docs/), and as a file.
NOTEBOOK_LINK = "lab-notebook/2026-12-04-BENCHMARKS.md"
NOTEBOOK = ROOT / "docs" / NOTEBOOK_LINK
README_ARCHIVE_LINK = "lab-notebook/2026-12-04-README.md"

# The page's sections, in this order: one result file each (benchmarks/results/NAME.json).
ORDER = (
    "training_speed",
    "train_py_default",
    "multi30k_quality",
    "serving_speed",
    "search_restructure",
    "ctranslate2_parity",
    "litert_size_quality",
    "export_load",
    "suite_time",
)
# The README's rows come first from these tables (by title), then from the others in ORDER.
README_ORDER = ("What `python train.py` takes and scores", "Multi30k quality", "Serving speed against CTranslate2")
# The definitions of the machines that rows name (the page's "Machines" section).
MACHINES_FILE = "machines.json"
# Files of benchmarks/results/ that are not result tables of this page.
OTHER_FILES = ("syntax_multi30k.json", MACHINES_FILE)
MACHINE_KEYS = ("label", "processor", "cpus", "instructions", "note")
MACHINE_COLUMNS = ("machine", "processor", "CPUs", "instruction sets", "note")

# The words a command says instead of a path of the machine it ran on, each defined once in
# the page's intro; a row's command uses these and nothing else of the kind.
PLACEHOLDERS = {
    "DATA": "a directory of the text files described in [Data](data.md): `DATA/multi30k` holds "
            "Multi30k's `train`, `valid` and `test2016` `.en` and `.de` files",
    "RUN": "the `train.py` run directory (`--model-dir`) the row measured",
    "EXPORT": "an export directory written by `python -m export.saved_model` (`EXPORT/1` its first "
              "version)",
    "WORK": "a scratch folder of your choice",
}
# A path of one machine: its data folder, home, or temporary or work directories. Shared by
# the check of the rows' commands and by tests/test_docs.py's check of README.md and docs/.
MACHINE_PATH = re.compile(r"(?<![\w.~-])(?:/(?:work|tmp|root|home|Users|mnt)/|(?:\.\./)+shared\b)")
# An upper-case word given to a flag as its value (`--model-dir RUN`), or starting a path
# (`DATA/multi30k`): a placeholder, which must be one of PLACEHOLDERS.
PLACEHOLDER_WORD = re.compile(r"--[\w-]+[ =]([A-Z][A-Z0-9_]*[A-Z])(?=[/\s;,)]|$)"
                              r"|(?<![\w./=-])([A-Z][A-Z0-9_]*[A-Z])/")

TOP_KEYS = ("title", "question", "how", "columns", "rows")
ROW_KEYS = ("values", "command", "commit", "date", "machine")
OPTIONAL_ROW_KEYS = ("commit_note", "readme", "notebook")
COMMIT_NOTES = ("recorded in",)
ROW_FIELDS = ("command", "commit", "date", "machine")  # the columns every table ends with
COMMIT_RE = re.compile(r"[0-9a-f]{7,40}")
DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


class ResultError(ValueError):
    """A malformed result file; the message is one line naming the file (and row)."""


def _display(path: Path) -> str:
    path = Path(path)
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _nonempty_string(value) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _placeholder_words(command: str) -> list:
    """The upper-case words `command` gives as a path: a flag's value (`--output DIR`), or a
    path's first part (`DATA/multi30k`)."""
    return [match.group(1) or match.group(2) for match in PLACEHOLDER_WORD.finditer(command)]


def validate(data, name: str, machines=None) -> dict:
    """Checks one result file's parsed JSON `data`; `name` is how errors name the file, and
    `machines` (the labels of machines.json, when given) the machines a row may name."""
    fail = _failer(name)

    if not isinstance(data, dict):
        fail("the file must hold a JSON object")
    missing = [key for key in TOP_KEYS if key not in data]
    if missing:
        fail(f"missing key(s) {', '.join(map(repr, missing))}")
    unknown = [key for key in data if key not in TOP_KEYS]
    if unknown:
        fail(f"unknown key(s) {', '.join(map(repr, unknown))}")
    for key in ("title", "question", "how"):
        if not _nonempty_string(data[key]):
            fail(f"{key!r} must be a non-empty string")
        if (match := MACHINE_PATH.search(data[key])):
            fail(f"{key!r} names a path of the machine it was measured on ({match.group(0)!r}...): write "
                 f"one of the placeholders {', '.join(PLACEHOLDERS)} instead")

    keys = _column_keys(data["columns"], fail)
    rows = data["rows"]
    if not isinstance(rows, list) or not rows:
        fail("'rows' must be a non-empty list")
    for number, row in enumerate(rows, 1):
        _check_row(row, number, keys, machines, fail)
    return data


def _failer(name: str):
    """`fail(message, row=None)`: raises the one-line `ResultError` naming the file (and row)."""
    def fail(message, row=None):
        where = f"{name}: row {row}: " if row is not None else f"{name}: "
        raise ResultError(_one_line(where + message))
    return fail


def _column_keys(columns, fail) -> list[str]:
    """The keys of a result file's checked `columns`."""
    if not isinstance(columns, list) or not columns:
        fail("'columns' must be a non-empty list")
    keys = []
    for index, column in enumerate(columns, 1):
        if (not isinstance(column, dict) or set(column) != {"key", "label"}
                or not _nonempty_string(column["key"]) or not _nonempty_string(column["label"])):
            fail(f"column {index} must be {{\"key\": non-empty string, \"label\": non-empty string}}")
        if column["key"] in keys:
            fail(f"column key {column['key']!r} appears twice")
        if column["key"] in ROW_FIELDS:
            fail(f"column key {column['key']!r} is one of every row's own fields {ROW_FIELDS}")
        keys.append(column["key"])

    return keys


def _check_row(row, number: int, keys: list[str], machines, fail) -> None:
    """Checks row `number` of a result file whose columns are `keys`."""
    if not isinstance(row, dict):
        fail("a row must be a JSON object", number)
    missing = [key for key in ROW_KEYS if key not in row]
    if missing:
        fail(f"missing key(s) {', '.join(map(repr, missing))}", number)
    unknown = [key for key in row if key not in ROW_KEYS + OPTIONAL_ROW_KEYS]
    if unknown:
        fail(f"unknown key(s) {', '.join(map(repr, unknown))}", number)
    values = row["values"]
    if not isinstance(values, dict):
        fail("'values' must be a JSON object", number)
    extra = [key for key in values if key not in keys]
    if extra:
        fail(f"value(s) for unknown column(s) {', '.join(map(repr, extra))}", number)
    absent = [key for key in keys if key not in values]
    if absent:
        fail(f"no value for column(s) {', '.join(map(repr, absent))}", number)
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            fail(f"value of column {key!r} must be a string or a number, got {value!r}", number)
        if isinstance(value, str) and (match := MACHINE_PATH.search(value)):
            fail(f"value of column {key!r} names a path of the machine it ran on ({match.group(0)!r}...)",
                 number)
    for key in ("command", "machine"):
        if not _nonempty_string(row[key]):
            fail(f"{key!r} must be a non-empty string", number)
    if (match := MACHINE_PATH.search(row["command"])):
        fail(f"'command' names a path of the machine it ran on ({match.group(0)!r}...): write one of "
             f"the placeholders {', '.join(PLACEHOLDERS)} instead", number)
    unknown = sorted({word for word in _placeholder_words(row["command"]) if word not in PLACEHOLDERS})
    if unknown:
        fail(f"'command' uses {', '.join(map(repr, unknown))} as a path: the placeholders are "
             f"{', '.join(PLACEHOLDERS)}", number)
    if machines is not None and row["machine"] not in machines:
        fail(f"'machine' {row['machine']!r} is not defined in benchmarks/results/{MACHINES_FILE}", number)
    if row.get("notebook") is not None and not _nonempty_string(row["notebook"]):
        fail("'notebook' must be a non-empty string, or null (measured after the notebook's archive)", number)
    commit = row["commit"]
    if not isinstance(commit, str) or not COMMIT_RE.fullmatch(commit):
        fail(f"'commit' must be 7-40 lowercase hex digits, got {commit!r}", number)
    if "commit_note" in row and row["commit_note"] not in COMMIT_NOTES:
        fail(f"'commit_note' must be one of {COMMIT_NOTES}, got {row['commit_note']!r}", number)
    if "readme" in row:
        readme = row["readme"]
        if (not isinstance(readme, dict) or set(readme) != {"what", "figure"}
                or not all(_nonempty_string(text) for text in readme.values())):
            fail("'readme' must be {\"what\": non-empty string, \"figure\": non-empty string}", number)
        try:
            readme["figure"].format(**values)
        except (KeyError, IndexError, ValueError) as error:
            fail(f"'readme' figure {readme['figure']!r} names no column: {error}", number)
    date = row["date"]
    valid_date = isinstance(date, str) and DATE_RE.fullmatch(date)
    if valid_date:
        try:
            datetime.date.fromisoformat(date)
        except ValueError:
            valid_date = False
    if not valid_date:
        fail(f"'date' must be a date YYYY-MM-DD, got {date!r}", number)


def _read_json(path: Path, name: str):
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ResultError(_one_line(f"{name}: cannot be read: {error.strerror or error}")) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ResultError(_one_line(f"{name}: not valid JSON: {error}")) from None


def load_result(path, machines=None) -> dict:
    """One result file, parsed and checked (`ResultError` names the file and row); with
    `machines` (labels), each row's machine must be one of them."""
    path = Path(path)
    name = _display(path)
    return validate(_read_json(path, name), name, machines)


def load_machines(path) -> dict:
    """machines.json as {label: definition}, checked (`ResultError` names the file and entry)."""
    path = Path(path)
    name = _display(path)
    data = _read_json(path, name)
    if not isinstance(data, dict) or set(data) != {"machines"} or not isinstance(data["machines"], list) \
            or not data["machines"]:
        raise ResultError(f"{name}: must be {{\"machines\": [a definition, ...]}}")
    machines = {}
    for number, machine in enumerate(data["machines"], 1):
        if (not isinstance(machine, dict) or set(machine) != set(MACHINE_KEYS)
                or not all(_nonempty_string(value) for value in machine.values())):
            raise ResultError(_one_line(f"{name}: machine {number} must have exactly the keys "
                                        f"{', '.join(MACHINE_KEYS)}, each a non-empty string"))
        if machine["label"] in machines:
            raise ResultError(_one_line(f"{name}: machine {number}: label {machine['label']!r} is defined twice"))
        machines[machine["label"]] = machine
    return machines


def load_results(results_dir=RESULTS_DIR, names=ORDER, machines=None) -> list:
    """The result files `names` (without `.json`) of `results_dir`, in that order, each row's
    machine checked against `machines` (default: the directory's machines.json)."""
    if machines is None:
        machines = load_machines(Path(results_dir) / MACHINES_FILE)
    return [load_result(Path(results_dir) / f"{name}.json", machines) for name in names]


def cell(value) -> str:
    """A value as the text of a Markdown table cell: one line, `|` escaped."""
    if isinstance(value, float):
        value = repr(value)
    return _one_line(value).replace("|", "\\|")


def code(text: str) -> str:
    """`text` as an inline code span (a span of backticks inside takes a longer fence)."""
    text = _one_line(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    if longest:
        text = f" {text} "
    return f"{fence}{text}{fence}"


def commit_cell(row: dict) -> str:
    """A row's commit as a table cell: the hash, with its note ("recorded in") where it has one."""
    commit = code(row["commit"])
    if row.get("commit_note"):
        commit += f" ({row['commit_note']})"
    return cell(commit)


def render_row(result: dict, row: dict) -> str:
    cells = [cell(row["values"][column["key"]]) for column in result["columns"]]
    cells += [cell(code(row["command"])), commit_cell(row), cell(row["date"]), cell(row["machine"])]
    return "| " + " | ".join(cells) + " |"


def render_table(result: dict) -> str:
    labels = [column["label"] for column in result["columns"]] + list(ROW_FIELDS)
    lines = ["| " + " | ".join(cell(label) for label in labels) + " |",
             "|" + "---|" * len(labels)]
    lines += [render_row(result, row) for row in result["rows"]]
    return "\n".join(lines)


def render_section(result: dict) -> str:
    sections = []
    for row in result["rows"]:
        if row.get("notebook") is not None and row["notebook"] not in sections:
            sections.append(row["notebook"])
    parts = [f"## {_one_line(result['title'])}", _one_line(result["question"]), _one_line(result["how"]),
             render_table(result)]
    if sections:  # (rows measured after the notebook's archive name none)
        named = "; ".join(f"\"{_one_line(section)}\"" for section in sections)
        noun = "section" if len(sections) == 1 else "sections"
        parts.append(f"Source: [the lab notebook]({NOTEBOOK_LINK}), {noun} {named}.")
    return "\n\n".join(parts)


# The intro's list of the placeholders, one item each.
_PLACEHOLDER_ITEMS = ";\n".join(f"    - `{word}`: {text}" for word, text in PLACEHOLDERS.items()) + "."

INTRO = f"""# Benchmarks

The project's current measured figures: one table per question, each row the latest
measurement of the code as it is, with the command that measured it, the commit, the date
and the machine. When a figure is measured again, its row is replaced in place, so the page
holds no superseded figure.

- **Re-measure** a row by running its command from the repository root, with these
  placeholders replaced by paths of yours:
{_PLACEHOLDER_ITEMS}
- **commit** is the code that was measured; "(recorded in)" marks the commit that recorded
  the figure, where the notebook does not name the code.
- **machine** names one of the [Machines](#machines) defined at the end of the page: 2-vCPU
  cloud VMs shared with other work unless a row says otherwise; their speed varies from VM to
  VM, so compare figures of one machine.
- **History:** every measurement, with its full output, the runs before it and the levers
  that did not pay, is in the [lab notebook]({NOTEBOOK_LINK}) (a dated archive; each
  table measured before it names its sections), and the README of that day is archived
  beside it ([2026-12-04 README]({README_ARCHIVE_LINK})).

Do not edit this page: edit `benchmarks/results/*.json` and run `python -m benchmarks.report`
(`python -m benchmarks.report --check` tells whether the page is up to date; the tests run it).
"""


def render_machines(results, machines) -> str:
    """The "Machines" section: the definition of each machine a row names, in machines.json's order."""
    named = {row["machine"] for result in results for row in result["rows"]}
    lines = ["## Machines", "",
             "Each machine named in a table above: its processor, CPUs and instruction sets (from "
             "`/proc/cpuinfo`; `benchmarks/results/machines.json`), and TensorFlow's float32 matmul "
             "speed on it where it was measured.", "",
             "| " + " | ".join(MACHINE_COLUMNS) + " |", "|" + "---|" * len(MACHINE_COLUMNS)]
    for label, machine in machines.items():
        if label in named:
            lines.append("| " + " | ".join(cell(machine[key]) for key in MACHINE_KEYS) + " |")
    return "\n".join(lines)


def render_page(results, machines) -> str:
    sections = [render_section(result) for result in results] + [render_machines(results, machines)]
    return INTRO + "".join("\n" + section + "\n" for section in sections)


def render_readme_table(results) -> str:
    """The README's "Current results" rows: each row of the results that has `readme`."""
    lines = ["| what | figure | machine | date | commit |", "|---|---|---|---|---|"]
    by_title = {result["title"]: result for result in results}
    ordered = [by_title[title] for title in README_ORDER if title in by_title]
    for result in ordered + [result for result in results if result["title"] not in README_ORDER]:
        for row in result["rows"]:
            if "readme" in row:
                figure = row["readme"]["figure"].format(**row["values"])
                lines.append(f"| {cell(row['readme']['what'])} | {cell(figure)} | {cell(row['machine'])} "
                             f"| {row['date']} | {commit_cell(row)} |")
    return "\n".join(lines)


def readme_with_results(readme: str, results) -> str:
    """`readme` with its results block replaced by the table of `results`."""
    if README_BEGIN not in readme or README_END not in readme:
        raise ResultError(f"README.md has no {README_BEGIN.strip()} ... {README_END} block")
    head, rest = readme.split(README_BEGIN, 1)
    tail = rest.split(README_END, 1)[1]
    return head + README_BEGIN + render_readme_table(results) + "\n" + README_END + tail


def generate(results_dir=RESULTS_DIR, names=ORDER) -> str:
    """The text of docs/benchmarks.md made from the result files."""
    machines = load_machines(Path(results_dir) / MACHINES_FILE)
    return render_page(load_results(results_dir, names, machines), machines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report",
        description="Write docs/benchmarks.md and README.md's current results from benchmarks/results/*.json.")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the page differs from what would be written")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help=argparse.SUPPRESS)
    parser.add_argument("--page", type=Path, default=PAGE, help=argparse.SUPPRESS)
    parser.add_argument("--readme", type=Path, default=README, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        machines = load_machines(args.results / MACHINES_FILE)
        results = load_results(args.results, machines=machines)
        outputs = {args.page: render_page(results, machines),
                   args.readme: readme_with_results(args.readme.read_text(encoding="utf-8"), results)}
    except ResultError as error:
        print(f"benchmarks.report: {error}", file=sys.stderr)
        return 1
    if args.check:
        stale = 0
        for path, text in outputs.items():
            try:
                current = path.read_text(encoding="utf-8")
            except OSError:
                current = None
            if current != text:
                state = "is missing" if current is None else "differs from what benchmarks/results/*.json give"
                print(f"benchmarks.report: {_display(path)} {state}: run python -m benchmarks.report",
                      file=sys.stderr)
                stale += 1
        return 1 if stale else 0
    for path, text in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {_display(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
