"""Smoke tests of the benchmarks on tiny settings (the figures themselves live in BENCHMARKS.md)."""

import concurrent.futures
import pathlib
import re
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
               for item in request.session.items if item.module is request.module):
        yield None
        return
    data = write_corpus(tmp_path_factory.mktemp("translate_speed") / "data", pairs=120, valid=4)
    run = in_background(
        subprocess.run,
        [sys.executable, "benchmarks/translate_speed.py", "--shape", "tiny", "--vocab-size", "60",
         "--tokenizer-text", f"{data}/train.en,{data}/train.de", "--sentences", str(data / "train.en"),
         "--count", "4", "--batch-sizes", "4", "--rounds", "1", "--quantizations", "float32", "--no-xla"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    yield run
    concurrent.futures.wait([run])


def test_gpu_step_counts_the_flops_of_the_model_it_times(capsys):
    """The benchmark's FLOP count equals 6 x the model's matmul parameters x tokens
    (the standard estimate) up to the attention-score terms it adds; and it runs
    (here on the TensorFlow backend, tiny)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_step
    finally:
        sys.path.pop(0)
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
        [sys.executable, "benchmarks/train_speed.py", "--preset", "tiny", "--data", "embedded",
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
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import input_pipeline
    finally:
        sys.path.pop(0)
    assert input_pipeline.main(["--data", "/nonexistent", "--preset", "tiny", "--vocab-size", "200",
                                "--batch-tokens", "256", "--steps", "3", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    pipeline = float(re.search(r"pipeline alone: [\d.]+ batches/s, ([\d,]+) target tokens/s", out).group(1)
                     .replace(",", ""))
    step = float(re.search(r"fit: ~([\d,]+) target tokens/s", out).group(1).replace(",", ""))
    name, value = out.strip().splitlines()[-1].split(": ")
    assert name == "pipeline_vs_step" and "data embedded" in out
    assert float(value) == pytest.approx(pipeline / step, rel=0.01, abs=0.06)


@pytest.mark.slow
def test_translate_speed_runs_both_sides_on_the_same_weights(translate_speed_run):
    # benchmarks/translate_speed.py --shape tiny --vocab-size 60 --tokenizer-text DATA/train.en,DATA/train.de
    #     --sentences DATA/train.en --count 4 --batch-sizes 4 --rounds 1 --quantizations float32 --no-xla
    result = translate_speed_run.result()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    # Same weights, same search: CTranslate2 returns the same translations as the SavedModel.
    assert re.search(r"serving_default vs ctranslate2 float32: 4 of 4 translations identical; "
                     r"target tokens (\d+) vs \1\n", out), out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert {"serving_default", "ctranslate2 float32"} <= set(rows)  # (--no-xla: test_export checks translate_xla)
    assert "| 1.00 (1.00-1.00) |" in rows["ctranslate2 float32"]  # the baseline of every ratio
    name, value = out.strip().splitlines()[-1].split(": ")
    assert name == "serving_default_vs_ctranslate2_float32_batch4" and float(value) > 0
    assert not result.stderr.strip(), result.stderr[-2000:]  # quiet: no TensorFlow start-up lines
