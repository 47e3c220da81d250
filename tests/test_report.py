"""docs/benchmarks.md is what `benchmarks.report` makes of benchmarks/results/*.json.

Pure Python and fast: neither these tests nor `benchmarks.report` import Keras or TensorFlow.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import report

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _seed():
    """Replaces conftest's autouse `_seed`, which imports Keras (and so TensorFlow) to seed it:
    nothing here is random."""
    yield


def tiny_result(**row_changes):
    row = {"values": {"model": "a|b", "ratio": "0.57-0.60"},
           "command": "python -m benchmarks.x --flag a|b", "commit": "54d9a7e", "date": "2026-12-02",
           "machine": "2-vCPU AMD EPYC Zen 4 (AVX-512)", "notebook": "Serving speed, part 41"}
    row.update(row_changes)
    other = {"values": {"model": "base", "ratio": 1.28}, "command": "python -m benchmarks.y",
             "commit": "3ae7432", "commit_note": "recorded in", "date": "2026-12-01",
             "machine": "2-vCPU AMD EPYC Zen 3 (AVX2)", "notebook": "Serving speed, part 39"}
    return {"title": "Tiny", "question": "What is it?", "how": "Measured so.",
            "columns": [{"key": "model", "label": "model"}, {"key": "ratio", "label": "ratio"}],
            "rows": [row, other]}


def write(directory, name, data):
    """`data` as `directory`/NAME.json, beside a copy of the real machines.json (unless the
    directory has one), which defines the machines tiny_result's rows name."""
    machines = Path(directory) / report.MACHINES_FILE
    if not machines.exists():
        machines.write_text((report.RESULTS_DIR / report.MACHINES_FILE).read_text(encoding="utf-8"),
                            encoding="utf-8")
    path = Path(directory) / f"{name}.json"
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def notebook_headings(path):
    """The text after the #s of every Markdown heading outside fenced code."""
    headings, fenced = set(), False
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.+)$", line)):
            headings.add(match.group(1).strip())
    return headings


def test_the_page_is_what_the_report_generates():
    assert report.PAGE.read_text(encoding="utf-8") == report.generate(), (
        "docs/benchmarks.md is not what benchmarks/results/*.json give: run python -m benchmarks.report")


def test_check_passes_on_the_page_and_fails_in_one_line_on_a_stale_one(tmp_path, capsys):
    assert report.main(["--check"]) == 0
    stale = tmp_path / "benchmarks.md"
    stale.write_text(report.generate().replace("| 2026-", "| 2025-", 1), encoding="utf-8")  # one date changed
    assert report.main(["--check", "--page", str(stale)]) == 1
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and "python -m benchmarks.report" in message
    assert report.main(["--check", "--page", str(tmp_path / "missing.md")]) == 1
    assert "is missing" in capsys.readouterr().err


def test_every_result_file_is_a_section_of_the_page():
    files = {path.name for path in report.RESULTS_DIR.glob("*.json")} - set(report.OTHER_FILES)
    assert files == {f"{name}.json" for name in report.ORDER}


def test_a_row_gives_its_values_command_commit_date_and_machine_with_pipes_escaped(tmp_path):
    write(tmp_path, "tiny", tiny_result())
    page = report.generate(tmp_path, names=("tiny",))
    lines = page.splitlines()
    assert "| model | ratio | command | commit | date | machine |" in lines
    assert ("| a\\|b | 0.57-0.60 | `python -m benchmarks.x --flag a\\|b` | `54d9a7e` | 2026-12-02 "
            "| 2-vCPU AMD EPYC Zen 4 (AVX-512) |") in lines
    assert ("| base | 1.28 | `python -m benchmarks.y` | `3ae7432` (recorded in) | 2026-12-01 "
            "| 2-vCPU AMD EPYC Zen 3 (AVX2) |") in lines
    assert "## Tiny" in lines and "What is it?" in lines and "Measured so." in lines
    source = next(line for line in lines if line.startswith("Source:"))
    assert f"]({report.NOTEBOOK_LINK})" in source
    assert '"Serving speed, part 41"; "Serving speed, part 39"' in source


def test_a_row_replaced_in_the_json_replaces_its_line_in_the_page(tmp_path):
    write(tmp_path, "tiny", tiny_result())
    before = report.generate(tmp_path, names=("tiny",)).splitlines()
    write(tmp_path, "tiny", tiny_result(values={"model": "a|b", "ratio": "0.61"}, commit="72f7956",
                                        date="2026-12-04"))
    after = report.generate(tmp_path, names=("tiny",)).splitlines()
    assert len(before) == len(after)
    changed = [i for i, (old, new) in enumerate(zip(before, after)) if old != new]
    assert len(changed) == 1
    assert "0.57-0.60" in before[changed[0]] and "0.57-0.60" not in "\n".join(after)
    assert after[changed[0]] == ("| a\\|b | 0.61 | `python -m benchmarks.x --flag a\\|b` | `72f7956` "
                                 "| 2026-12-04 | 2-vCPU AMD EPYC Zen 4 (AVX-512) |")


def _without(data, key):
    del data[key]
    return data


def _unknown_column(data):
    data["rows"][0]["values"]["speed"] = "1.0"
    return data


def _missing_column(data):
    del data["rows"][0]["values"]["ratio"]
    return data


def _row(key, value):
    def change(data):
        data["rows"][0][key] = value
        return data
    return change


@pytest.mark.parametrize("break_it, words", [
    (lambda data: _without(data, "how"), ["missing key", "'how'"]),
    (_unknown_column, ["row 1", "unknown column", "'speed'"]),
    (_missing_column, ["row 1", "no value for column", "'ratio'"]),
    (_row("date", "2026/12/02"), ["row 1", "'date'", "YYYY-MM-DD"]),
    (_row("date", "2026-13-02"), ["row 1", "'date'"]),
    (_row("commit", "main"), ["row 1", "'commit'"]),
    (_row("commit_note", "measured"), ["row 1", "'commit_note'"]),
    (_row("command", "python train.py --data /work/shared/data/multi30k"), ["row 1", "'command'", "'/work/'"]),
    (_row("command", "python -m benchmarks.x --model-dir /tmp/s79/runs/m"), ["row 1", "'command'", "'/tmp/'"]),
    (_row("command", "python train.py --data ../shared/data/multi30k"), ["row 1", "'command'", "'../shared'"]),
    (_row("command", "python -m export.saved_model --model-dir RUN --output DIR"), ["row 1", "'DIR'", "RUN"]),
    (lambda data: {**data, "how": "Read from /home/me/data."}, ["'how'", "'/home/'"]),
])
def test_a_malformed_result_file_is_a_one_line_error_naming_the_file(tmp_path, break_it, words):
    path = write(tmp_path, "broken", break_it(tiny_result()))
    with pytest.raises(ValueError) as raised:
        report.load_result(path)
    assert isinstance(raised.value, report.ResultError)
    message = str(raised.value)
    assert "\n" not in message and str(path) in message
    for word in words:
        assert word in message


def test_a_row_measured_after_the_notebooks_archive_names_no_section(tmp_path):
    """A row without `notebook` (or with null) is a row of the table like the others; the
    Source line names the sections of the rows that have one, and a table whose rows have
    none has no Source line. An empty `notebook` is still an error."""
    without = tiny_result()
    del without["rows"][0]["notebook"]
    write(tmp_path, "mixed", without)
    null = tiny_result(notebook=None)
    null["rows"][1]["notebook"] = None
    write(tmp_path, "later", null)
    mixed, later = (report.generate(tmp_path, names=(name,)).split(report.INTRO, 1)[1]
                    for name in ("mixed", "later"))
    assert ("| a\\|b | 0.57-0.60 | `python -m benchmarks.x --flag a\\|b` | `54d9a7e` | 2026-12-02 "
            "| 2-vCPU AMD EPYC Zen 4 (AVX-512) |") in mixed.splitlines()
    assert f"Source: [the lab notebook]({report.NOTEBOOK_LINK}), section \"Serving speed, part 39\"." in mixed
    assert "Source:" not in later and "| base | 1.28 |" in later
    path = write(tmp_path, "empty", tiny_result(notebook=" "))
    with pytest.raises(report.ResultError, match="row 1: 'notebook' must be a non-empty string, or null"):
        report.load_result(path)


def test_invalid_json_and_a_missing_file_are_one_line_errors_and_exit_1(tmp_path, capsys):
    path = write(tmp_path, "training_speed", {})  # (beside machines.json), then broken
    path.write_text('{"title": "x",\n', encoding="utf-8")
    with pytest.raises(report.ResultError, match="training_speed.json: not valid JSON"):
        report.load_result(path)
    assert report.main(["--results", str(tmp_path), "--page", str(tmp_path / "page.md")]) == 1
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and "training_speed.json" in message
    assert not (tmp_path / "page.md").exists()


def test_every_notebook_section_named_by_a_result_is_a_heading_of_the_lab_notebook():
    headings = notebook_headings(report.NOTEBOOK)
    assert "Serving speed, part 41: LiteRT on `base` and on a trained model on an AVX-512 EPYC (issue #16, " \
           "2026-12-02 19:06-19:42)" in headings
    named = {(result["title"], row["notebook"]) for result in report.load_results() for row in result["rows"]
             if row.get("notebook") is not None}
    assert named and {pair for pair in named if pair[1] not in headings} == set()


def test_the_page_links_only_files_that_exist_beside_it():
    page = report.PAGE.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)]+)\)", page)
    files = [link.split("#")[0] for link in links if not link.startswith("#")]  # anchors: mkdocs
    assert files and all((report.PAGE.parent / file).is_file() for file in files)


def test_the_report_imports_no_tensorflow():
    code = ("import sys, benchmarks.report; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'keras_transformer') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_readmes_results_are_the_rows_marked_for_it_with_their_figures_filled_in(tmp_path):
    """The README's "Current results" block holds each row that has `readme`, its figure made
    from the row's own values (so the README cannot keep a figure the page replaced), and
    the README on disk is what the report writes."""
    data = tiny_result(readme={"what": "speed of a|b", "figure": "{ratio}x CTranslate2"})
    write(tmp_path, "tiny", data)
    results = report.load_results(tmp_path, names=("tiny",))
    assert report.render_readme_table(results).splitlines() == [
        "| what | figure | machine | date | commit |", "|---|---|---|---|---|",
        "| speed of a\\|b | 0.57-0.60x CTranslate2 | 2-vCPU AMD EPYC Zen 4 (AVX-512) | 2026-12-02 | `54d9a7e` |"]
    readme = "# Title\n\n<!-- results:begin -->\nold\n<!-- results:end -->\n\nAfter.\n"
    updated = report.readme_with_results(readme, results)
    assert updated.startswith("# Title\n\n<!-- results:begin -->\n| what |") and updated.endswith(
        "<!-- results:end -->\n\nAfter.\n") and "old" not in updated
    with pytest.raises(report.ResultError, match="no <!-- results:begin -->"):
        report.readme_with_results("# Title\n", results)
    real = report.README.read_text(encoding="utf-8")
    assert real == report.readme_with_results(real, report.load_results())


@pytest.mark.parametrize("readme, words", [
    ({"what": "x", "figure": "{speed}x"}, ["row 1", "'readme'", "speed"]),
    ({"what": "x"}, ["row 1", "'readme'"]),
])
def test_a_readme_entry_naming_no_column_is_a_one_line_error(tmp_path, readme, words):
    path = write(tmp_path, "broken", tiny_result(readme=readme))
    with pytest.raises(report.ResultError) as raised:
        report.load_result(path)
    assert "\n" not in str(raised.value) and all(word in str(raised.value) for word in words)


def test_a_command_says_placeholders_each_defined_once_in_the_intro_and_used_by_some_row():
    """Issue #92: the commands are ones anyone can copy. The intro defines each placeholder
    once, the rows' commands use no other upper-case word as a path (load_result checks), and
    each defined placeholder is used, so the list holds no stale word."""
    definitions = [line for line in report.INTRO.splitlines() if re.match(r"\s+- `[A-Z]+`: ", line)]
    assert [re.match(r"\s+- `([A-Z]+)`", line).group(1) for line in definitions] == list(report.PLACEHOLDERS)
    commands = " ".join(row["command"] for result in report.load_results() for row in result["rows"])
    assert {word for word in report.PLACEHOLDERS if word not in report._placeholder_words(commands)} == set()
    assert report.MACHINE_PATH.search(report.PAGE.read_text(encoding="utf-8")) is None


def test_a_row_naming_an_undefined_machine_is_a_one_line_error_naming_file_row_and_label(tmp_path, capsys):
    path = write(tmp_path, "tiny", tiny_result(machine="a laptop"))
    with pytest.raises(report.ResultError) as raised:
        report.load_results(tmp_path, names=("tiny",))
    message = str(raised.value)
    assert "\n" not in message and str(path) in message and "row 1" in message and "'a laptop'" in message
    assert "machines.json" in message
    (tmp_path / report.MACHINES_FILE).write_text('{"machines": [{"label": "x"}]}', encoding="utf-8")
    with pytest.raises(report.ResultError, match="machine 1 must have exactly the keys"):
        report.load_results(tmp_path, names=("tiny",))


def test_the_machines_section_defines_each_machine_the_tables_name_and_no_other(tmp_path):
    write(tmp_path, "tiny", tiny_result())
    page = report.generate(tmp_path, names=("tiny",))
    machines = page.split("\n## Machines\n", 1)[1]
    rows = [line for line in machines.splitlines() if line.startswith("| 2-vCPU") or line.startswith("| NVIDIA")]
    assert [line.split(" | ")[0][2:] for line in rows] == ["2-vCPU AMD EPYC Zen 4 (AVX-512)",
                                                           "2-vCPU AMD EPYC Zen 3 (AVX2)"]
    assert "family 25 model 17" in rows[0] and "family 25 model 1 " in rows[1]
    real = report.PAGE.read_text(encoding="utf-8").split("\n## Machines\n", 1)[1]
    named = {row["machine"] for result in report.load_results() for row in result["rows"]}
    assert {label for label in named if f"| {label} |" not in real} == set()
