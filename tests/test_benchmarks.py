"""Smoke tests of the benchmarks on tiny settings (the figures themselves live in docs/lab-notebook)."""

import concurrent.futures
import json
import pathlib
import re
import statistics
import subprocess
import sys

import pytest
from helpers import in_background, write_corpus

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def translate_speed_run(tmp_path_factory, request):
    """The translate_speed smoke run (a subprocess, as a user runs it; the longest of
    this module), started when the module starts, so that it runs while the module's
    other tests (in the file before its own) run theirs: a Future of the CompletedProcess,
    None when its test is not selected in this session."""
    if not any(item.originalname == "test_translate_speed_runs_both_sides_on_the_same_weights"
               for item in request.session.items if getattr(item, "module", None) is request.module):
        yield None
        return
    folder = tmp_path_factory.mktemp("translate_speed")
    data = write_corpus(folder / "data", pairs=120, valid=4)
    # --work-dir holding what an earlier run left (a SavedModel version, a CTranslate2
    # model, a LiteRT file): the run replaces them (it once ended in convert's FileExistsError)
    work = folder / "work"
    (work / "export" / "1").mkdir(parents=True)
    (work / "export" / "1" / "saved_model.pb").write_bytes(b"earlier")
    (work / "ctranslate2-float32").mkdir()
    (work / "ctranslate2-float32" / "model.bin").write_bytes(b"earlier")
    (work / "model.tflite").write_bytes(b"earlier")
    run = in_background(
        subprocess.run,
        [sys.executable, "-m", "benchmarks.translate_speed", "--shape", "tiny", "--vocab-size", "60",
         "--tokenizer-text", f"{data}/train.en,{data}/train.de", "--sentences", str(data / "train.en"),
         "--count", "4", "--batch-sizes", "4", "--rounds", "1", "--quantizations", "float32", "--no-xla",
         "--threads", "1,2", "--beam-size", "3", "--export-patience", "2", "--patience", "2", "--onednn",
         "--work-dir", str(work)],
        # A guard against a hang, not a speed check: on a 2-core CI machine, beside both
        # xdist workers, the run took 287 s (210 s alone) and was killed at 300.
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    yield run, work
    concurrent.futures.wait([run])


def test_harness_rounds_rotate_the_order_and_keep_each_calls_seconds():
    """The one rounds policy: every call once per round, round r starting r places along;
    a call's own reported seconds are kept; the summaries are median (min-max) and per-round
    ratios; the table has its separator; the closing lines end with `name: value`."""
    from benchmarks import harness

    order, reported = [], {"a": iter([3.0, 1.0, 2.0]), "c": iter([6.0, 6.0, 3.0])}
    calls = {name: (lambda n=name: order.append(n) or (next(reported[n]) if n in reported else None))
             for name in ("a", "b", "c")}
    rounds_done = []
    seconds = harness.interleaved_rounds(calls, 3, after_round=lambda: rounds_done.append(len(order)))
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"] and rounds_done == [3, 6, 9]
    assert seconds["a"] == [3.0, 1.0, 2.0] and seconds["c"] == [6.0, 6.0, 3.0]
    assert len(seconds["b"]) == 3 and all(0 <= s < 0.1 for s in seconds["b"])  # timed: it returned None
    assert harness.spread(seconds["a"]) == "2.00 (1.00-3.00)"
    assert harness.round_ratios(seconds["c"], seconds["a"]) == [2.0, 6.0, 1.5]
    assert harness.table(["x", "y"], [[1, "2"]]) == "| x | y |\n|---|---|\n| 1 | 2 |"
    assert harness.finish("speedup", "1.23").splitlines()[-1] == "speedup: 1.23"
    assert harness.header("t", "fact").startswith("# t: ") and harness.header("t", "fact").endswith("; fact")
    import tensorflow as tf

    from keras_transformer.console import onednn_state

    # TensorFlow's oneDNN kernels named beside its version (train.py turns them on; the CPU decides otherwise)
    assert harness.versions(tf) == f"TF {tf.__version__} (oneDNN {onednn_state()})" and onednn_state() in ("on", "off")


def test_gpu_step_counts_the_flops_of_the_model_it_times(capsys):
    """The benchmark's FLOP count equals 6 x the model's matmul parameters x tokens
    (the standard estimate) up to the attention-score terms it adds; and it runs
    (here on the TensorFlow backend, tiny)."""
    from benchmarks import gpu_step
    from keras_transformer import TransformerConfig, build_transformer

    config = TransformerConfig.from_preset("small", vocab_size=8000)
    params = build_transformer(config).count_params()  # embedding = output projection (shared)
    sentences, length = 128, 32
    estimate = 6 * params * sentences * length
    assert gpu_step.step_flops(config, sentences, length) == pytest.approx(estimate, rel=0.02)
    assert gpu_step.step_flops(config, sentences, length) > estimate  # + attention scores and sums

    assert gpu_step.main(["--preset", "tiny", "--vocab-size", "100", "--batch-tokens", "64", "--length", "8",
                          "--steps", "1", "--rounds", "1", "--peak-size", "32", "--precisions", "float32"]) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if line.startswith("| float32 |")]) == 1
    name, value = out.strip().splitlines()[-1].split(": ")
    assert name == "float32_target_tokens_per_second" and float(value) > 0


@pytest.mark.slow
def test_train_speed_compares_the_same_architecture_from_keras_hub():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.train_speed", "--preset", "tiny", "--data", "embedded",
         "--vocab-size", "200", "--batch-tokens", "256", "--batches", "1", "--rounds", "1",
         "--peak-size", "256"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    # The same architecture: keras-hub's assembly has exactly our parameter count.
    counts = re.search(r"# parameters: ours ([\d,]+), keras-hub ([\d,]+)", out)
    assert counts and counts.group(1) == counts.group(2), out
    rows = {line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")}
    assert {"ours", "keras-hub"} <= rows
    name, value = out.strip().splitlines()[-1].split(": ")
    assert name == "ours_vs_keras_hub" and float(value) > 0


def test_input_pipeline_benchmark_reports_its_ratio_from_its_own_figures(capsys):
    """benchmarks/input_pipeline.py in process (it sets no environment on import), on the embedded
    corpus: the last line is the printed pipeline rate over the printed fit rate."""
    from benchmarks import input_pipeline
    assert input_pipeline.main(["--data", "/nonexistent", "--preset", "tiny", "--vocab-size", "200",
                                "--batch-tokens", "256", "--steps", "3", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    pipeline = float(re.search(r"pipeline alone: [\d.]+ batches/s, ([\d,]+) target tokens/s", out).group(1)
                     .replace(",", ""))
    step = float(re.search(r"fit: ~([\d,]+) target tokens/s", out).group(1).replace(",", ""))
    name, value = out.strip().splitlines()[-1].split(": ")
    assert name == "pipeline_vs_step" and "data embedded" in out
    assert float(value) == pytest.approx(pipeline / step, rel=0.01, abs=0.06)


def _tables(out):
    """Markdown tables of a benchmark's output: first header cell -> rows of stripped cells."""
    tables = {}
    for block in out.split("\n\n"):
        lines = [line for line in block.splitlines() if line.startswith("| ")]
        if lines:
            cells = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines]
            tables[cells[0][0]] = cells[1:]
    return tables


def _median_and_range(text):
    """`1.23 (1.00-1.50)` -> (1.23, 1.00, 1.50)."""
    median, low, high = re.fullmatch(r"([\d.]+) \(([\d.]+)-([\d.]+)\)", text).groups()
    return float(median), float(low), float(high)


def _ratio_of_printed(rate, baseline):
    """The ratio of two rates printed rounded to integers, as a 2-decimal ratio of the
    unrounded rates may print it."""
    ratio = rate / baseline
    return pytest.approx(ratio, abs=0.0051 + ratio * (0.5 / rate + 0.5 / baseline))


def test_translate_speed_parses_its_thread_counts():
    from benchmarks.translate_speed import parse_args

    assert parse_args(["--shape", "tiny"]).threads == [1, 2]
    assert parse_args(["--shape", "tiny", "--threads", "2,1"]).threads == [2, 1]
    for wrong in ("0", "1,1", "two", ","):
        with pytest.raises(SystemExit):
            parse_args(["--shape", "tiny", "--threads", wrong])


@pytest.mark.slow
def test_translate_speed_runs_both_sides_on_the_same_weights(translate_speed_run):
    # benchmarks/translate_speed.py --shape tiny --vocab-size 60 --tokenizer-text DATA/train.en,DATA/train.de
    #     --sentences DATA/train.en --count 4 --batch-sizes 4 --rounds 1 --quantizations float32 --no-xla
    #     --threads 1,2 --beam-size 3 --export-patience 2 --patience 2 --onednn --work-dir WORK
    run, work = translate_speed_run
    result = run.result()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    # Same weights, same search: CTranslate2 returns the same translations as the SavedModel.
    # The beam is --beam-size on both sides, not the tiny preset's 4 (an export traced with
    # the config's beam gave 2 of 4 here).
    assert re.search(r"serving_default vs ctranslate2 float32: 4 of 4 translations identical; "
                     r"target tokens (\d+) vs \1\n", out), out
    names = {"serving_default", "serving_default onednn", "litert float32", "ctranslate2 float32"}
    # (--no-xla: test_export checks translate_xla)
    assert "serving_default vs litert float32: 4 of 4 translations identical" in out  # LiteRT, in its own worker
    # --onednn: the same signature in a worker with TensorFlow's oneDNN kernels on, the
    # plain one with them off; --export-patience: our side searches with CTranslate2's rule.
    assert "serving_default vs serving_default onednn: 4 of 4 translations identical" in out
    assert "stopping: ours patience 2, CTranslate2 patience 2" in out
    # every engine at each thread count, in a worker of its own, translating alike
    assert ("# translations identical at 1, 2 threads, of 4: serving_default 4, serving_default onednn 4, "
            "litert float32 4, ctranslate2 float32 4") in out
    tables = _tables(out)
    per_thread = {(row[0], int(row[1])): (_median_and_range(row[2]), _median_and_range(row[3]))
                  for row in tables["batch 4"]}
    assert set(per_thread) == {(name, threads) for name in names for threads in (1, 2)}, out
    for (name, threads), ((rate, _, _), (ratio, low, high)) in per_thread.items():
        # --rounds 1: the ratio of the round is the ratio of the printed rates (to their rounding)
        baseline = per_thread["ctranslate2 float32", threads][0][0]
        assert low == ratio == high and ratio == _ratio_of_printed(rate, baseline)
        assert rate > 0
    for threads in (1, 2):
        assert per_thread["ctranslate2 float32", threads][1] == (1.0, 1.0, 1.0)
    # each engine's best: the thread count of its highest rate, that rate, and the ratio of
    # its best to CTranslate2 float32's best (not to CTranslate2 at the same thread count)
    best = {row[0]: (int(row[1]), _median_and_range(row[2]), _median_and_range(row[3]))
            for row in tables["batch 4: best"]}
    assert set(best) == names, out
    baseline_best = max(per_thread["ctranslate2 float32", t][0][0] for t in (1, 2))
    for name, (threads, (rate, _, _), (ratio, low, high)) in best.items():
        rates = {t: per_thread[name, t][0][0] for t in (1, 2)}
        assert rate == max(rates.values()) and rates[threads] == rate, (name, out)
        assert low == ratio == high
        assert ratio == _ratio_of_printed(rate, baseline_best), (name, out)
    assert best["ctranslate2 float32"][2] == (1.0, 1.0, 1.0)
    # The random shaped model never ends a hypothesis (its EOS embedding is zero), so
    # every sentence runs to its limit, source pieces + 50: that many loop steps, and
    # every sentence's beams in every step (4 sentences x beam 3); the time per step is
    # each variant's at its best thread count.
    pieces = int(re.search(r"sources of exactly (\d+) pieces", out).group(1))
    search = {row[0]: ([float(x) for x in row[1:4]], int(row[4])) for row in tables["batch 4: search"]}
    assert set(search) == {"serving_default (search)", "serving_default onednn (search)",
                           "litert float32 (search)"}, out
    for name, ((steps, rows, milliseconds), threads) in search.items():
        assert steps == pieces + 50 and rows == 12.0 and milliseconds > 0
        assert threads == best[name.removesuffix(" (search)")][0]
    # the last line: serving_default's best over CTranslate2 float32's best
    name, value = out.strip().splitlines()[-1].split(": ")
    assert name == "serving_default_best_vs_ctranslate2_float32_best_batch4"
    assert float(value) == best["serving_default"][2][0]
    # the earlier run's files in --work-dir were replaced, with a line that says so
    assert f"# --work-dir {work}: replacing an earlier run's export/1, model.tflite, ctranslate2-float32\n" in out
    assert [path.name for path in (work / "export").iterdir()] == ["1"]
    assert (work / "export" / "1" / "saved_model.pb").stat().st_size > len(b"earlier")
    assert (work / "ctranslate2-float32" / "model.bin").stat().st_size > len(b"earlier")
    assert (work / "model.tflite").stat().st_size > len(b"earlier")
    assert not result.stderr.strip(), result.stderr[-2000:]  # quiet: no TensorFlow start-up lines


@pytest.mark.slow
def test_profile_train_step_splits_the_step_by_part_of_the_model(tmp_path):
    """benchmarks/profile_train_step.py on tiny: the parts' fractions add up to the
    whole; the projections, attention and feed-forward each have self time, forward
    and backward (their name scopes are recognised, not lumped into `other`); the
    printed step figures agree with each other. Its trace goes to the test's own
    directory (not the default, runs/profile_train_step, which would keep one from every suite run)."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.profile_train_step", "--preset", "tiny", "--data", "embedded",
         "--vocab-size", "200", "--batch-tokens", "256", "--batches", "1", "--passes", "2", "--peak-size", "256",
         "--logdir", str(tmp_path / "logdir")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    parts = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 4 and cells[1] in ("forward", "backward", "update"):
            parts[(cells[0], cells[1])] = (float(cells[2]), float(cells[3]))
    # each printed fraction is rounded to 3 places: the sum is 1 within half a unit per row
    # (CI once summed 2-place fractions to 0.98, the rounding, not a lost part)
    assert sum(fraction for _, fraction in parts.values()) == pytest.approx(1.0, abs=0.0005 * len(parts) + 1e-9)
    for label in ("attention projections (Q/K/V/O)", "attention scores, softmax, context", "feed-forward"):
        for phase in ("forward", "backward"):
            assert parts[(label, phase)][0] > 0, (label, phase, out)
    assert parts.get(("other", "forward"), (0, 0))[1] + parts.get(("other", "backward"), (0, 0))[1] < 0.5, out
    step = re.search(r"step time: ([\d.]+) s per pass \(median of ([\d., ]+)\); ([\d,]+) target tokens/s", out)
    median = float(step.group(1))
    assert median == pytest.approx(statistics.median(float(s) for s in step.group(2).split(", ")), abs=1e-3)
    tokens = int(re.search(r"; (\d+) real target tokens", out).group(1))
    assert int(step.group(3).replace(",", "")) == pytest.approx(tokens / median, rel=0.03)  # median printed to 1 ms
    name, value = out.strip().splitlines()[-1].split(": ")
    assert name == "seconds_per_pass" and float(value) == pytest.approx(float(step.group(1)), abs=1e-3)


def test_loss_benchmark_reference_is_the_package_loss_and_runs(capsys):
    """benchmarks/loss.py's reference (the gather formulation the package had) gives
    the package loss's value and gradient; the script runs (in process, tiny) and
    its last line is the speedup it printed for the last vocabulary."""
    import numpy as np
    import tensorflow as tf

    from benchmarks import loss as loss_benchmark
    from keras_transformer import LabelSmoothedCrossEntropy

    rng = np.random.default_rng(5)
    logits = tf.constant(rng.normal(size=(3, 6, 50)).astype("float32") * 2)
    labels = rng.integers(1, 50, (3, 6)).astype("int32")
    labels[1, 2:] = 0
    results = []
    for loss in (loss_benchmark.gather_loss(0.1), LabelSmoothedCrossEntropy(0.1)):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = loss(labels, logits)
        results.append((float(value), tape.gradient(value, logits).numpy()))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6) and results[0][0] > 1
    np.testing.assert_allclose(results[1][1], results[0][1], atol=1e-7)

    assert loss_benchmark.main(["--vocab-sizes", "40,60", "--tokens", "3x4", "--rounds", "1", "--repeats", "1",
                                "--threads", "0"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if re.match(r"\| \d", line)]
    assert [int(r[0]) for r in rows] == [40, 60]
    name, value = out.strip().splitlines()[-1].split(": ")
    assert name == "speedup_at_60" and float(value) == pytest.approx(float(rows[-1][3].split()[0]), abs=0.006)


def test_multi30k_benchmark_never_trains_a_finished_run_again(tmp_path):
    """A finished run whose export failed (results.json without 'export'): the benchmark
    stops with one line naming the export command instead of resuming training (which
    would start a second time budget); train.py never runs (no checkpoints appear)."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("test2016.en", "test2016.de"):
        (data / name).write_text("a\n", encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text('{"steps": 250}', encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "benchmarks.multi30k", "--model-dir", str(run), "--data", str(data)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"multi30k: {run} holds a finished run without an export (results.json has no 'export'): make one with "
        f"`python -m export.saved_model --model-dir {run} --output {run / 'export'}` and run this again")
    assert "Traceback" not in result.stderr and "train.py" not in result.stdout
    assert sorted(p.name for p in run.iterdir()) == ["results.json"]


def test_multi30k_benchmark_names_a_split_whose_sides_differ_in_length(tmp_path):
    """A test split whose .en and .de differ by a line would pair every sentence after the
    gap with the wrong reference: the benchmark stops with one line naming both counts
    before it translates (the export it names does not exist: it is never opened)."""
    from benchmarks import multi30k

    data = tmp_path / "data"
    data.mkdir()
    (data / "test2016.en").write_text("a man .\na dog .\n", encoding="utf-8")
    # U+2028 inside a line is no line break for the benchmarks' reader (str.splitlines would split it)
    (data / "test2016.de").write_text("ein mann \u2028 .\n", encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"steps": 1, "export": str(run / "missing")}), encoding="utf-8")
    with pytest.raises(SystemExit) as stopped:
        multi30k.main(["--model-dir", str(run), "--data", str(data)])
    assert stopped.value.code == (f"multi30k: {data / 'test2016'}.en has 2 lines, .de 1: "
                                  f"the split's files must be line-aligned")


def test_multi30k_benchmark_trains_with_the_presets_budget_unless_given_one(tmp_path, monkeypatch, capsys):
    """The train.py command the benchmark runs: `--max-minutes` only when `--minutes` is given,
    so that each preset keeps its own budget (`multi30k-literature` has none: a 56-minute
    default cut its 8,000 updates at about 2,400)."""
    from benchmarks import multi30k

    data = tmp_path / "data"
    data.mkdir()
    for name in ("test2016.en", "test2016.de"):
        (data / name).write_text("a\n", encoding="utf-8")
    commands = []

    def train_py(command, **kwargs):
        commands.append(command)
        return subprocess.CompletedProcess(command, 1, stdout="")

    monkeypatch.setattr(multi30k.subprocess, "run", train_py)
    for flags in ([], ["--minutes", "20"]):
        with pytest.raises(SystemExit, match="^multi30k: train.py failed with exit code 1$"):
            multi30k.main(["--model-dir", str(tmp_path / "run"), "--data", str(data), "--config",
                           "multi30k-literature", *flags])
    assert [command[1:] for command in commands] == [
        ["train.py", "--config", "multi30k-literature", "--data", str(data), "--model-dir", str(tmp_path / "run")],
        ["train.py", "--config", "multi30k-literature", "--data", str(data), "--model-dir", str(tmp_path / "run"),
         "--max-minutes", "20"]]
    headers = [line for line in capsys.readouterr().out.splitlines() if line.startswith("# multi30k:")]
    assert [header.rsplit("; ", 1)[-1] for header in headers] == [
        "the preset's budget, preset multi30k-literature", "budget 20 min, preset multi30k-literature"]


def test_multi30k_benchmark_drops_tensorflows_harmless_lines_and_keeps_the_others(tmp_path, monkeypatch, capfd):
    """`benchmarks.multi30k.translate` and its `--patience` table run the export's signatures with
    TensorFlow's lines that ask nothing of the user (`console.HARMLESS_LINES`: oneDNN's int32
    fallback, logged as an error) dropped from file descriptor 2, as `export.translate` does; any
    other line stays."""
    import os

    import tensorflow as tf

    from benchmarks import multi30k
    from keras_transformer.console import ONEDNN_FALLBACK_LINES, QUIET_ENV

    fallback = ("E0000 util.cc:131] oneDNN supports DT_INT32 " + ONEDNN_FALLBACK_LINES[0] + " if present.\n")

    def serving_default(text):
        os.write(2, fallback.encode() + b"a line that asks something\n")
        return {"translation": tf.strings.upper(text)}

    def translate_options(text, **options):
        return {"translations": serving_default(text)["translation"][:, None]}

    export = type("Export", (), {"signatures": {multi30k.SIGNATURE: serving_default,
                                                "translate_options": translate_options}})()
    monkeypatch.setattr(tf.saved_model, "load", lambda path: export)
    monkeypatch.setenv(QUIET_ENV, "1")
    capfd.readouterr()
    assert multi30k.translate("EXPORT", ["a", "b", "c"], batch_size=2) == ["A", "B", "C"]
    assert capfd.readouterr().err == "a line that asks something\n" * 2
    sources = ["a man sees the dog", "the cat buys a book", "a red house today"]  # (4-grams: BLEU 100)
    (tmp_path / "valid.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "valid.de").write_text("\n".join(sources).upper() + "\n", encoding="utf-8")
    table = multi30k.patience_table("EXPORT", tmp_path, ["valid"], [1.0], (4, 0.6, 10), batch_size=2)
    assert [line.split(" | ")[:3] for line in table[2:]] == [["| 0 (exact)", "100.00", "3/3"], ["| 1", "100.00", "3/3"]]
    assert capfd.readouterr().err == "a line that asks something\n" * 4  # two requests for each patience


def test_step_nodes_counts_each_loop_step_once(tmp_path, capsys):
    """benchmarks/step_nodes.py on a random tiny model whose outputs never end: the loop
    runs exactly to the limit (source + EOS + 50 steps), and every loop variable's
    NextIteration runs once a step, so its count per step is a whole number (a count
    off by one step would not divide); the command prints the same per-step figure."""
    from benchmarks import step_nodes

    args = step_nodes.parse_args(["--shape", "tiny", "--source-tokens", "5", "--batch-sizes", "1,3"])
    model, config, tokenizer, _ = step_nodes.model_and_tokenizer(args)
    ids, lengths = step_nodes.sources(args, config, tokenizer)
    assert ids.shape == (3, 6) and (lengths == 6).all()
    step_nodes.save_search(model, config, args.beam_size, str(tmp_path / "search"))
    steps, ops = step_nodes.count_nodes(str(tmp_path / "search"), ids[:1], lengths[:1])
    assert steps == 6 + config.decode_extra_length
    loop_variables = ops["NextIteration"] / steps
    assert loop_variables == int(loop_variables) and 15 <= loop_variables <= 40, ops["NextIteration"]
    assert ops["LoopCond"] == steps + 1
    per_step = sum(ops.values()) / steps
    assert 200 < per_step < 2000, per_step
    # A batch-1 request runs the small-request loop, whose projections are `BatchMatMulV3`
    # nodes (`searcher.eigen_matmul`: TensorFlow's oneDNN pass leaves them to Eigen): per
    # layer Q, K, V and output of self-attention, Q and output of cross-attention, two of
    # the feed-forward, then the output projection; no `MatMul` of any naming (with oneDNN
    # `_MklNativeFusedMatMul`, `_MklMatMul`) is left in the loop.
    assert ops["BatchMatMulV3"] == steps * (8 * config.num_layers + 1), ops["BatchMatMulV3"]
    assert not [kind for kind in ops if "MatMul" in kind and kind != "BatchMatMulV3"], ops
    # The kernel times come from the same trace: the same op types, and the projections took time.
    _, nodes, micros = step_nodes.trace_loop(str(tmp_path / "search"), ids[:1], lengths[:1])
    assert set(micros) == set(nodes) == set(ops)
    assert micros["BatchMatMulV3"] > 0, micros
    # `--options-search`: translate_options' search (the beam size a run-time input) in the same
    # TF1 session runs the same loop steps, every loop variable once a step.
    step_nodes.save_search(model, config, args.beam_size, str(tmp_path / "options"), options=True)
    options_steps, options_ops = step_nodes.count_nodes(str(tmp_path / "options"), ids[:1], lengths[:1])
    assert options_steps == steps and options_ops["LoopCond"] == steps + 1
    assert options_ops["NextIteration"] % steps == 0, options_ops["NextIteration"]

    assert step_nodes.main(["--shape", "tiny", "--source-tokens", "5", "--batch-sizes", "1"]) == 0
    out = capsys.readouterr().out
    assert f"#### batch 1: {steps} loop steps, {per_step:.1f} nodes run per step" in out
    assert out.strip().splitlines()[-1] == f"nodes_per_step_batch1: {per_step:.1f}"


def test_literature_bleu_is_multi_bleu_on_moses_lowercased_tokens(tmp_path, capsys):
    """The Multi30k literature's metric (issue #17): Moses lowercase, normalize-punctuation and
    tokenizer.perl (-l de, escaped) on both sides, then multi-bleu.perl's corpus BLEU. The
    pipeline's known outputs, BLEU equal to sacreBLEU's on the hand-tokenized lines, and not
    13a's lowercased figure (13a keeps "geht's" whole, tokenizer.perl splits it)."""
    import sacrebleu

    from benchmarks import literature_bleu

    hypotheses = ["Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
                  "Er geht's an, das T-Shirt ist 3,5 m lang.",
                  "Über „Hallo“ sagt er: \"Ja\" & lacht (laut)."]
    references = ["Ein Mann mit einem orangen Hut, der etwas anstarrt.",
                  "Er geht's an, das T-Shirt ist 3,5 Meter lang.",
                  "Über „Hallo“ sagt er laut: \"Ja\" & lacht."]
    tokenized = ["ein mann mit einem orangefarbenen hut , der etwas anstarrt .",
                 "er geht &apos; s an , das t-shirt ist 3,5 m lang .",
                 "über &quot; hallo &quot; sagt er : &quot; ja &quot; &amp; lacht ( laut ) ."]
    assert literature_bleu.moses_lc_tok(hypotheses, "de") == tokenized
    reference_tokens = literature_bleu.moses_lc_tok(references, "de")
    want = sacrebleu.corpus_bleu(tokenized, [reference_tokens], tokenize="none", smooth_method="none").score
    got = literature_bleu.lc_tok_bleu(hypotheses, references, "de").score
    assert got == pytest.approx(want, abs=1e-9) and 20 < got < 90
    lowercased_13a = sacrebleu.corpus_bleu(hypotheses, [references], lowercase=True).score
    assert abs(got - lowercased_13a) > 0.5
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        literature_bleu.lc_tok_bleu(hypotheses[:2], references)
    hyp_file, ref_file = tmp_path / "hyp.de", tmp_path / "ref.de"
    hyp_file.write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    ref_file.write_text("\n".join(references) + "\n", encoding="utf-8")
    assert literature_bleu.main([str(hyp_file), str(ref_file)]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == f"lc_tok_bleu: {want:.2f}"
    assert f"# lowercased sacreBLEU {lowercased_13a:.2f} [nrefs:1|case:lc|" in out


def test_multi30k_lc_tok_writes_the_literatures_text_and_scores_it_as_it_is(tmp_path, capsys):
    """Issue #93: `multi30k_lc_tok` writes every SPLIT.en / SPLIT.de pair in the literature's
    training form (the Moses pipeline's known outputs, line for line), and `lc_tok_bleu`'s
    `tokenized` scores such text as it is: multi-bleu on the tokens, where a second pass of the
    pipeline would escape `&quot;` again (`&amp; quot ;`) and give another figure."""
    from benchmarks import literature_bleu, multi30k_lc_tok

    data = tmp_path / "raw"
    data.mkdir()
    english = ["Two young, White males are outside.", "He said \"hi\"."]
    german = ["Zwei junge weiße Männer sind im Freien.", "Er sagte \"Hallo\"."]
    (data / "train.en").write_text("\n".join(english) + "\n", encoding="utf-8")
    (data / "train.de").write_text("\n".join(german) + "\n", encoding="utf-8")
    (data / "notes.en").write_text("no German side: not a split\n", encoding="utf-8")
    assert multi30k_lc_tok.main(["--data", str(data), "--output", str(tmp_path / "lc")]) == 0
    assert sorted(p.name for p in (tmp_path / "lc").iterdir()) == ["train.de", "train.en"]
    assert (tmp_path / "lc" / "train.en").read_text(encoding="utf-8").splitlines() == [
        "two young , white males are outside .", "he said &quot; hi . &quot;"]  # (English: the stop moves in)
    assert (tmp_path / "lc" / "train.de").read_text(encoding="utf-8").splitlines() == [
        "zwei junge weiße männer sind im freien .", "er sagte &quot; hallo &quot; ."]
    with pytest.raises(SystemExit):
        multi30k_lc_tok.main(["--data", str(data), "--output", str(data)])
    assert "--output must not be --data" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        multi30k_lc_tok.main(["--data", str(tmp_path / "lc" / "none"), "--output", str(tmp_path / "x")])
    assert "has no SPLIT.en / SPLIT.de pair" in capsys.readouterr().err

    hypotheses = ["er sagte &quot; hallo &quot; .", "zwei junge männer sind im freien ."]
    references = ["er sagte &quot; hallo &quot; laut .", "zwei junge weiße männer sind im freien ."]
    import sacrebleu

    want = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none", smooth_method="none").score
    got = literature_bleu.lc_tok_bleu(hypotheses, references, tokenized=True).score
    again = literature_bleu.lc_tok_bleu(hypotheses, references).score  # the pipeline run a second time
    assert got == pytest.approx(want, abs=1e-9) and 20 < got < 90 and abs(got - again) > 0.5
    assert literature_bleu.moses_lc_tok(hypotheses[:1], "de") == ["er sagte &amp; quot ; hallo &amp; quot ; ."]


def test_the_literatures_commands_name_the_missing_moses_scripts(tmp_path, monkeypatch, capsys):
    """Without sacremoses (an extra, not a dependency) the commands that need the Moses
    pipeline stop with one line naming the extra to install, before they read or write
    anything; text already in the literature's form (`--tokenized`) is still scored, and
    `benchmarks.multi30k` prints the line in place of the literature's figure instead of
    losing the run's own."""
    import sacrebleu

    from benchmarks import literature_bleu, multi30k, multi30k_lc_tok

    monkeypatch.setitem(sys.modules, "sacremoses", None)  # `import sacremoses` raises ImportError
    assert not literature_bleu.have_moses()
    want = ("the literature's lowercased Moses-tokenized text needs sacremoses (the Moses scripts' Python port), "
            'which is not installed: python -m pip install -e ".[bench]"')
    hypotheses, references = ["ein mann läuft .", "zwei hunde"], ["ein mann läuft .", "zwei katzen"]
    hyp_file, ref_file = tmp_path / "hyp.de", tmp_path / "ref.de"
    hyp_file.write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    ref_file.write_text("\n".join(references) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit) as stopped:
        literature_bleu.main([str(hyp_file), str(ref_file)])
    assert stopped.value.code == f"literature_bleu: {want}"
    tokens = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none", smooth_method="none",
                                   force=True).score
    assert 0 < tokens < 100
    assert literature_bleu.main([str(hyp_file), str(ref_file), "--tokenized"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"lc_tok_bleu: {tokens:.2f}"

    data = tmp_path / "raw"
    data.mkdir()
    (data / "train.en").write_text("A man.\n", encoding="utf-8")
    (data / "train.de").write_text("Ein Mann.\n", encoding="utf-8")
    with pytest.raises(SystemExit) as stopped:
        multi30k_lc_tok.main(["--data", str(data), "--output", str(tmp_path / "lc")])
    assert stopped.value.code == f"multi30k_lc_tok: {want}"
    assert not (tmp_path / "lc").exists()

    assert multi30k.literature_line("valid", hypotheses, references) == (
        f"# valid lowercased Moses-tokenized BLEU (the literature's): not computed: {want}")
    assert multi30k.literature_line("valid", hypotheses, references, tokenized=True) == (
        f"# valid lowercased Moses-tokenized BLEU (multi-bleu.perl, the literature's) {tokens:.2f}")


def test_multi30k_patience_table_decodes_as_the_export_was_built(tmp_path):
    """benchmarks/multi30k.py --patience translates with the export's own beam, alpha and
    extra length (the multi30k preset's 5 and 1.0, not the paper's 4 and 0.6 it once
    hard-coded), `--patience-beam` replacing the beam; an export without its config file
    gets the paper's (TransformerConfig's defaults)."""
    from benchmarks.multi30k import decoding_options
    from export.saved_model import write_export_config
    from keras_transformer import TransformerConfig

    config = TransformerConfig.from_preset("multi30k", vocab_size=100)
    write_export_config(tmp_path / "new", config, patience=0.0)
    assert (config.beam_size, config.length_penalty_alpha) == (5, 1.0)
    assert decoding_options(tmp_path / "new") == (5, 1.0, config.decode_extra_length)
    assert decoding_options(tmp_path / "new", beam_size=4) == (4, 1.0, config.decode_extra_length)
    (tmp_path / "old").mkdir()
    paper = TransformerConfig()
    assert decoding_options(tmp_path / "old") == (paper.beam_size, paper.length_penalty_alpha, 50) == (4, 0.6, 50)


def test_train_speed_times_a_recipe_candidate_against_the_preset(capsys):
    """benchmarks/train_speed.py --variants ours,ours-set --set ...: the second model is the
    preset with the fields set (its parameter count is that model's), timed on the same
    batches; the last line is its step ratio. Bad settings are refused before any work."""
    from benchmarks import train_speed
    from keras_transformer import TransformerConfig, build_transformer

    assert train_speed.main(["--preset", "tiny", "--data", "embedded", "--vocab-size", "200",
                             "--batch-tokens", "256", "--batches", "1", "--rounds", "1", "--peak-size", "64",
                             "--threads", "0", "--variants", "ours,ours-set",
                             "--set", "num_decoder_layers=1", "--set", "d_ff=64"]) == 0
    out = capsys.readouterr().out
    vocab = int(re.search(r"# preset tiny: .*vocab (\d+);", out).group(1))
    counts = re.search(r"# parameters: ours ([\d,]+), ours-set ([\d,]+)", out)
    expected = {name: build_transformer(TransformerConfig.from_preset("tiny", vocab_size=vocab, **fields))
                .count_params() for name, fields in
                (("ours", {}), ("ours-set", {"num_decoder_layers": 1, "d_ff": 64}))}
    assert [int(counts.group(i).replace(",", "")) for i in (1, 2)] == [expected["ours"], expected["ours-set"]]
    assert expected["ours-set"] < expected["ours"]
    assert "# ours-set: num_decoder_layers=1, d_ff=64" in out
    name, value = out.strip().splitlines()[-1].split(": ")
    assert name == "ours_set_vs_ours" and float(value) > 0
    # ours-set-xla: the same candidate with its step compiled by XLA (train.py --jit-compile)
    small = TransformerConfig.from_preset("tiny", vocab_size=200, d_ff=64)
    assert [train_speed.build_variant(name, small, 0).jit_compile for name in ("ours-set", "ours-set-xla")] \
        == [False, True]
    # ours-keras-adam: Keras's own Adam with make_optimizer's settings and schedule; ours: FusedAdam
    from keras_transformer.training.schedule import FusedAdam
    keras_adam = train_speed.build_variant("ours-keras-adam", small, 0).optimizer
    fused = train_speed.build_variant("ours", small, 0).optimizer
    assert type(keras_adam).__name__ == "Adam" and isinstance(fused, FusedAdam)
    assert ((keras_adam.beta_1, keras_adam.beta_2, keras_adam.epsilon, float(keras_adam.learning_rate))
            == (fused.beta_1, fused.beta_2, fused.epsilon, float(fused.learning_rate)))

    for argv, message in [(["--variants", "ours,ours-set"], "--set and the ours-set variant go together"),
                          (["--variants", "ours,ours-set-xla"], "--set and the ours-set variant go together"),
                          (["--set", "d_ff=64"], "--set and the ours-set variant go together"),
                          (["--variants", "ours,ours-set", "--set", "num_heads=3"],
                           "--set: num_heads=3 does not divide d_model=128"),
                          (["--variants", "ours,ours-set", "--set", "vocab_size=9"],
                           "--set 'vocab_size=9': expected FIELD=VALUE")]:
        with pytest.raises(SystemExit):
            train_speed.parse_args(["--preset", "tiny"] + argv)
        assert message in capsys.readouterr().err


def test_profile_train_step_refuses_a_variant_it_cannot_build(capsys):
    """profile_train_step.py --variant: one of train_speed's variants of ours that need no
    other flag; ours-set (which needs --set) and unknown names are refused in one line."""
    from benchmarks import profile_train_step

    assert profile_train_step.parse_args(["--variant", "ours-xla"]).variant == "ours-xla"
    for variant in ("ours-set", "ours-set-xla", "ours-typo", "keras-hub"):
        with pytest.raises(SystemExit):
            profile_train_step.parse_args(["--variant", variant])
        assert "--variant: expected one of ours, ours-fused" in capsys.readouterr().err


def test_every_multi30k_sweep_candidate_is_a_command_train_py_accepts():
    """Each candidate of benchmarks/multi30k_sweep.py is an hour of training: its flags must
    parse, as the sweep gives them to train.py, before that hour starts, and set what the
    candidate says. The two literature schedules are checked by their peak rate: Wu et al.
    2021's 5e-3 at the end of a 2,000-step warm-up, against the paper's rate for the preset."""
    import shlex

    import train
    from benchmarks.multi30k_sweep import CANDIDATES, COMMON_FLAGS
    from keras_transformer.training.schedule import TransformerSchedule

    runs = {}
    for name, (_, flags) in CANDIDATES.items():
        argv = ["--config", "multi30k", "--data", "unused", "--model-dir", "unused",
                *shlex.split(COMMON_FLAGS), *shlex.split(flags)]
        runs[name] = train.parse_args(argv).run
    preset = runs["multi30k"]
    assert (preset.steps, preset.keep_checkpoints) == (40000, 10)

    def peak(run):
        config = run.model_config(run.vocab_size)
        return float(TransformerSchedule(config.d_model, config.warmup_steps, config.learning_rate_scale)(
            config.warmup_steps - 1))

    assert peak(preset) == pytest.approx(128 ** -0.5 * 200 ** -0.5, rel=1e-6)  # 0.00625
    wu = runs["wu-4x4-schedule"]
    assert peak(wu) == pytest.approx(5e-3, rel=2e-3)
    wu_model = wu.model_config(wu.vocab_size)
    assert (wu_model.num_layers, wu_model.d_ff, wu_model.dropout, wu.batch_tokens) == (4, 256, 0.3, 8192)
    assert (preset.vocab_size, runs["vocab-8000"].vocab_size, runs["vocab-4000"].vocab_size) == (10_000, 8000, 4000)
    assert runs["subword-0.1-dropout-0.1"].subword_alpha == 0.1
    assert runs["subword-0.1-dropout-0.1"].model_config(10_000).dropout == 0.1


def test_optimizer_build_benchmark_reports_the_ratio_of_its_own_medians(capsys):
    """benchmarks/optimizer_build.py in process, tiny, one round: one row per preset with
    the model's variable count, and the last line is its in-trace over eager seconds."""
    from benchmarks import optimizer_build
    from keras_transformer import TransformerConfig, build_transformer

    assert optimizer_build.main(["--presets", "tiny", "--vocab-size", "40", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    (row,) = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| tiny |")]
    variables = len(build_transformer(TransformerConfig.from_preset("tiny", vocab_size=40)).trainable_variables)
    assert int(row[1]) == variables
    eager, trace, ratio = float(row[2].split()[0]), float(row[3].split()[0]), float(row[4])
    assert ratio == pytest.approx(trace / eager, rel=0.02)  # seconds to 3 decimals, the ratio to 2
    name, value = out.strip().splitlines()[-1].split(": ")
    assert name == "trace_over_eager" and value == row[4].strip()


LSCPU_ZEN4 = """Architecture:                            x86_64
Vendor ID:                               AuthenticAMD
Model name:                              AMD EPYC
CPU family:                              25
Model:                                   17
Flags:                                   fpu sse avx2 avx512f avx512_vnni
Hypervisor vendor:                       KVM
"""


def test_ctranslate2_parity_rows_replace_their_models_rows_in_a_file_the_report_reads(tmp_path):
    """benchmarks/ctranslate2_parity.py's bookkeeping, without a model: its rows replace the
    rows of the same model where they were and keep the others; the file it writes is one
    `benchmarks.report` reads (rows without a lab notebook section); the command it records
    leaves out where it wrote; the machine is named as the other result files name theirs."""
    from benchmarks import ctranslate2_parity as parity
    from benchmarks import report

    figure = parity.Figure("greedy search", "`translate_batch`, beam 1", 19, 20, 1.5e-05, "")
    assert parity.row_values("toy", figure) == {
        "model": "toy", "ours": "greedy search", "theirs": "`translate_batch`, beam 1", "identical": "19/20",
        "difference": "1.5e-05", "note": "-"}
    assert [parity.format_difference(v) for v in (None, 0.0, 0.46)] == ["-", "0", "4.6e-01"]

    def rows(*names):
        return [{"values": {"model": name.rstrip("0123456789")}, "name": name} for name in names]

    merged = parity.merge_rows(rows("b1", "a1", "c1", "a2"), rows("a3", "a4"), "a")
    assert [row["name"] for row in merged] == ["b1", "a3", "a4", "c1"]
    assert [row["name"] for row in parity.merge_rows(rows("b1"), rows("a1"), "a")] == ["b1", "a1"]

    assert parity.recorded_command(["--run-dir", "/tmp/r", "--results", "x.json", "--label", "a b",
                                    "--results=y.json"]) == \
        "python -m benchmarks.ctranslate2_parity --run-dir /tmp/r --label 'a b'"
    machine = parity.machine_description(LSCPU_ZEN4, 2)
    assert machine == "2-vCPU AMD EPYC Zen 4 (AVX-512)"
    zen3 = LSCPU_ZEN4.replace("Model:                                   17", "Model:  1").replace(" avx512f", "")
    assert parity.machine_description(zen3, 2) == "2-vCPU AMD EPYC Zen 3 (AVX2)"
    named = {row["machine"] for result in report.load_results() for row in result["rows"]}
    assert {machine, parity.machine_description(zen3, 2)} <= named

    path = tmp_path / "parity.json"
    parity.write_rows(path, "toy", [figure], "python -m benchmarks.ctranslate2_parity", machine)
    parity.write_rows(path, "run", [figure, figure], "python -m benchmarks.ctranslate2_parity --run-dir r", machine)
    parity.write_rows(path, "toy", [figure], "python -m benchmarks.ctranslate2_parity", machine)
    result = report.load_result(path)
    assert [row["values"]["model"] for row in result["rows"]] == ["toy", "run", "run"]
    assert "notebook" not in result["rows"][0]
    page = report.render_section(result)
    assert "| model | ours | CTranslate2 | identical | max \\|difference\\| | note | command |" in page
    assert "| toy | greedy search | `translate_batch`, beam 1 | 19/20 | 1.5e-05 | - |" in page
