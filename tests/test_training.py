"""keras_transformer.training in process: seeds, NaN guard, data fingerprint,
stop signals, progress figures. Runs use a train-only toy corpus (no
validation split, so no BLEU decoding) and a few steps of `tiny`."""

import json
import pathlib
import signal
import time

import keras
import numpy as np
import pytest
from helpers import WORDS_DE, WORDS_EN

import keras_transformer
from keras_transformer import run_dir
from keras_transformer.callbacks import NonFiniteLossError, Progress, StepGuard, TimeBudget
from keras_transformer.config import (PRESETS, SYNTAX_FIELDS, TRAINING_DEFAULTS, ConfigError, TrainingConfig,
                                      TransformerConfig, command_line_options, options_table)
from keras_transformer.constants import PAD_ID
from keras_transformer.losses import TargetTokens
from keras_transformer.run_dir import RunError
from keras_transformer.stop_signals import Interrupted, StopSignals
from keras_transformer.training import averaged_checkpoints, train_and_evaluate


def write_train_only(directory, pairs=160, seed=0):
    import random

    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    src, tgt = [], []
    for _ in range(pairs):
        idx = [rng.randrange(len(WORDS_EN)) for _ in range(rng.randint(3, 7))]
        src.append(" ".join(WORDS_EN[i] for i in idx))
        tgt.append(" ".join(WORDS_DE[i] for i in idx))
    (directory / "train.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    (directory / "train.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    return write_train_only(tmp_path_factory.mktemp("toy") / "data")


def run_config(data, model_dir, **values):
    values = {"steps": 4, "checkpoint_every": 2, **values}
    return TrainingConfig.create("tiny", data=str(data), model_dir=str(model_dir), vocab_size=60,
                                 batch_tokens=256, bleu_every_sentences=0, **values)


def history_losses(model_dir):
    return [row["loss"] for row in run_dir.read_history(model_dir)]


def test_training_config_defaults_come_from_the_preset():
    tiny = TrainingConfig.create("tiny")
    assert (tiny.steps, tiny.batch_tokens, tiny.checkpoint_every, tiny.average, tiny.keep_checkpoints,
            tiny.beam_size, tiny.vocab_size) == (600, 2048, 60, 5, 5, 4, 1000)
    big = TrainingConfig.create("big", steps=1000)
    assert (big.batch_tokens, big.checkpoint_every, big.average, big.keep_checkpoints) == (25000, 100, 20, 20)
    assert TrainingConfig.create("big", steps=1000, keep_checkpoints=30).keep_checkpoints == 30
    # Issue #19: fewer checkpoints kept than averaged was raised to the average without a word.
    with pytest.raises(ValueError, match="^keep_checkpoints=3 is below average=20: the last 20 checkpoints"):
        TrainingConfig.create("big", steps=1000, keep_checkpoints=3)
    # ...and a batch that cannot hold one longest pair was a traceback from the batching code.
    with pytest.raises(ValueError, match="^batch_tokens=32 cannot hold one pair of max_length=64 tokens"):
        TrainingConfig.create("tiny", batch_tokens=32)
    assert TrainingConfig.create("tiny", batch_tokens=32, max_length=32).batch_tokens == 32
    assert TrainingConfig.create("base").steps == 100_000
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        TrainingConfig.create("huge")
    with pytest.raises(ValueError, match="^steps must be a positive integer, got 0$"):
        TrainingConfig.create("tiny", steps=0)


def test_multi30k_recipe_preset():
    run = TrainingConfig.create("multi30k")
    # Issue #17: the whole hour (56 training minutes; averaging, BLEU and export in the rest),
    # the step count only a cap.
    assert (run.batch_tokens, run.checkpoint_every, run.average, run.max_minutes, run.vocab_size,
            run.steps) == (4096, 250, 5, 56.0, 8000, 40_000)
    config = run.model_config(8000)
    assert (config.num_layers, config.d_model, config.d_ff, config.num_heads, config.dropout,
            config.warmup_steps) == (2, 128, 512, 4, 0.2, 200)
    assert TrainingConfig.create("multi30k", max_minutes=5, checkpoint_every=50).max_minutes == 5
    assert TrainingConfig.create("tiny").max_minutes == 0
    with pytest.raises(ValueError, match="^max_minutes must be >= 0, got -1$"):
        TrainingConfig.create("tiny", max_minutes=-1)
    assert TransformerConfig.from_preset("multi30k").max_length == 64


def test_set_flag_changes_model_fields_and_names_bad_ones(capsys):
    """train.py --set FIELD=VALUE: each value read as its field's type, on top of the preset
    (its beam becomes the run's BLEU beam); a bad one is a one-line error naming it."""
    import train

    run = train.parse_args(["--config", "multi30k", "--set", "dropout=0.3", "--set", "num_layers=4",
                            "--set", "d_ff=256", "--set", "norm_first=true", "--set", "beam_size=5"]).run
    assert run.model == {"dropout": 0.3, "num_layers": 4, "d_ff": 256, "norm_first": True, "beam_size": 5}
    config = run.model_config(8000)
    assert (config.num_layers, config.d_ff, config.dropout, config.norm_first, config.beam_size,
            config.d_model, config.warmup_steps) == (4, 256, 0.3, True, 5, 128, 200)
    assert run.beam_size == 5
    assert train.parse_args(["--config", "multi30k"]).run.model_config(8000) == TransformerConfig.from_preset(
        "multi30k", vocab_size=8000)
    for flags, message in [
            (["--set", "dropout=1.5"], "--set: TransformerConfig.dropout must be in [0, 1), got 1.5"),
            (["--set", "dropout=high"], "--set 'dropout=high': dropout takes a float"),
            (["--set", "vocab_size=9"], "--set 'vocab_size=9': expected FIELD=VALUE with FIELD one of num_layers"),
            (["--set", "num_heads=3"], "--set: num_heads=3 does not divide d_model=128"),
            (["--set", "norm_first=maybe"], "--set 'norm_first=maybe': norm_first takes a bool")]:
        with pytest.raises(SystemExit) as exit_:
            train.parse_args(flags)
        assert exit_.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines
    with pytest.raises(ValueError, match=r"model: \['max_length'\] cannot be set this way"):
        TrainingConfig.create("tiny", model={"max_length": 32})


def test_time_budget_stops_when_the_next_round_would_end_past_it(monkeypatch):
    class Model:
        stop_training = False
        optimizer = type("Optimizer", (), {"iterations": keras.Variable(0)})()

    clock = [0.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    budget = TimeBudget(100, started=0.0)
    budget.set_model(Model())
    for begin, end, stops in [(10, 40, False), (40, 70, False), (70, 71, False), (71, 86, True)]:
        clock[0] = begin
        budget.on_epoch_begin(0)
        clock[0] = end
        budget.on_epoch_end(0)
        # round 2 ends at 70 and took 30: 100, not past; round 4 ends at 86 + 15 > 100
        assert (budget.exhausted, budget.model.stop_training) == (stops, stops)


def test_seed_gives_identical_runs_from_scratch(toy_data, tmp_path):
    first = train_and_evaluate(run_config(toy_data, tmp_path / "a", seed=3))
    second = train_and_evaluate(run_config(toy_data, tmp_path / "b", seed=3))
    other = train_and_evaluate(run_config(toy_data, tmp_path / "c", seed=4))
    assert history_losses(tmp_path / "a") == history_losses(tmp_path / "b")
    for a, b in zip(first.model.get_weights(), second.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert history_losses(tmp_path / "a") != history_losses(tmp_path / "c")
    assert first.results["steps"] == 4


def poisoned_optimizer(from_step):
    """`make_optimizer` whose learning rate is NaN from update `from_step` on."""
    from keras import ops

    from keras_transformer.schedule import TransformerSchedule

    class Poisoned(keras.optimizers.schedules.LearningRateSchedule):
        def __init__(self, base):
            self.base = base

        def __call__(self, iteration):  # 0-based: update k runs with iteration k - 1
            return ops.where(iteration >= from_step - 1, float("nan"), self.base(iteration))

    def make(config):
        return keras.optimizers.Adam(Poisoned(TransformerSchedule(config.d_model, config.warmup_steps)),
                                     beta_1=0.9, beta_2=0.98, epsilon=1e-9)

    return make


@pytest.mark.parametrize("every, poisoned_step, caught", [
    (2, 5, "the training loss became nan at step 6"),  # the loss after the bad update
    (5, 10, "the weights hold NaN or infinite values at step 10"),  # bad update right at a checkpoint
])
def test_nan_stops_training_and_keeps_the_last_good_checkpoint(toy_data, tmp_path, monkeypatch,
                                                               every, poisoned_step, caught):
    from keras_transformer.checkpoints import CheckpointStore

    monkeypatch.setattr(keras_transformer, "make_optimizer", poisoned_optimizer(poisoned_step))
    model_dir = tmp_path / "run"
    with pytest.raises(NonFiniteLossError) as error:
        train_and_evaluate(run_config(toy_data, model_dir, steps=12, checkpoint_every=every))
    message = str(error.value)
    good = every * ((poisoned_step - 1) // every)  # last checkpoint before the bad update
    assert caught in message
    assert f"the newest checkpoint is still ckpt-{good} (finite weights)" in message
    assert "\n" not in message
    steps = [int(row["step"]) for row in run_dir.read_history(model_dir)]
    assert steps == list(range(every, good + 1, every))
    assert not (model_dir / run_dir.FINAL_WEIGHTS).exists()
    # The newest checkpoint on disk is the good one, and its weights are finite.
    config = run_dir.load_config(model_dir)
    model = keras_transformer.build_transformer(config)
    optimizer = keras_transformer.schedule.make_optimizer(config)
    optimizer.build(model.trainable_variables)
    from keras_transformer.data import Tokenizer, tokenizer_path

    store = CheckpointStore(model_dir / run_dir.CHECKPOINT_DIR, model, optimizer,
                            Tokenizer.load(tokenizer_path(model_dir)).sha256)
    assert store.paths[-1].endswith(f"ckpt-{good}")
    assert store.restore_latest() == good
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_resume_on_changed_data_needs_allow_data_change(tmp_path):
    data = write_train_only(tmp_path / "data")
    model_dir = tmp_path / "run"
    train_and_evaluate(run_config(data, model_dir, steps=2))
    recorded = json.loads((model_dir / run_dir.RUN_FILE).read_text())["data"]["fingerprint"]
    assert recorded["splits"]["train"]["target"]["file"] == "train.de"

    with (data / "train.de").open("a", encoding="utf-8") as f:
        f.write("der Hund\n")
    with (data / "train.en").open("a", encoding="utf-8") as f:
        f.write("the dog\n")
    with pytest.raises(RunError, match=r"the training data changed since the run started \(.*train\.de.*\); "
                                       r"pass --allow-data-change") as error:
        train_and_evaluate(run_config(data, model_dir, steps=4))
    assert "\n" not in str(error.value)
    assert [int(r["step"]) for r in run_dir.read_history(model_dir)] == [2]  # nothing trained

    resumed = train_and_evaluate(run_config(data, model_dir, steps=4, allow_data_change=True))
    assert resumed.results["steps"] == 4
    record = json.loads((model_dir / run_dir.RUN_FILE).read_text())
    assert record["previous_data"][0]["fingerprint"] == recorded
    assert record["data"]["fingerprint"]["splits"]["train"]["pairs"] == 161
    # The new data is now the run's: resuming again needs no flag.
    train_and_evaluate(run_config(data, model_dir, steps=4))


def test_stop_signals_ask_once_then_interrupt():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        signal.raise_signal(signal.SIGTERM)
        assert signals.received == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # a second Ctrl-C quits at once
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stop_signal_exits_after_the_grace_period_when_the_main_thread_is_stuck():
    """Issue #19: a SIGTERM while the input pipeline stalled was caught and never acted on
    (Python runs handlers only between the main thread's bytecodes). The watcher thread
    ends the process (128 + the signal) when the grace period passes, or 2 s after a
    second signal; a run that stops by itself in time is left alone."""
    calls = []
    with StopSignals(grace_seconds=0.3, exit=calls.append) as signals:
        signal.raise_signal(signal.SIGTERM)
        assert signals.received == "SIGTERM"
        time.sleep(1.0)  # the "step" never ends
        assert calls == [128 + signal.SIGTERM]
    with StopSignals(grace_seconds=0.5, exit=calls.append):
        signal.raise_signal(signal.SIGTERM)  # the run then stops by itself, in time
    time.sleep(1.0)
    assert calls == [128 + signal.SIGTERM]


def test_a_stop_signal_ends_a_process_blocked_inside_tensorflow():
    """The real case: the main thread waits inside a TensorFlow op that never returns."""
    import subprocess
    import sys

    code = ("import sys, tensorflow as tf\n"
            "from keras_transformer.stop_signals import StopSignals\n"
            "queue = tf.queue.FIFOQueue(1, tf.int32)\n"
            "with StopSignals(grace_seconds=1.5):\n"
            "    print('ready', flush=True)\n"
            "    queue.dequeue()  # blocks forever, in C++\n")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert process.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    started = time.time()
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert 1.4 < time.time() - started < 30
    assert "no training step ended within 1.5 s of SIGTERM: exiting now without a new checkpoint" in stderr
    assert "Traceback" not in stderr


def test_a_corpus_with_every_pair_too_long_is_refused_before_fit(toy_data, tmp_path):
    """Issue #19: the length filter runs after repeat(), so `fit` waited forever for a
    first batch. Now a one-line error names the files and the figures, at once."""
    started = time.time()
    with pytest.raises(RunError, match=r"train\.en / .*train\.de: all 160 training pairs are longer than "
                                       r"max_length=3 tokens \(source \d+, target \d+\), so no batch"):
        train_and_evaluate(run_config(toy_data, tmp_path / "run", max_length=3))
    assert time.time() - started < 120
    assert not (tmp_path / "run" / run_dir.CHECKPOINT_DIR).exists()


def test_every_test_set_of_a_directory_is_scored(toy_data, tmp_path):
    """Issue #19: with several test*.* files (test2016, test2017) no test BLEU was
    computed and nothing said so. Each is scored under its own name."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(toy_data, data)
    lines = {lang: (toy_data / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de")}
    for stem, start in (("test2016", 0), ("test2017", 3)):
        for lang in ("en", "de"):
            (data / f"{stem}.{lang}").write_text("\n".join(lines[lang][start:start + 2]) + "\n", encoding="utf-8")
    results = train_and_evaluate(run_config(data, tmp_path / "run", steps=2, max_length=12, beam_size=1)).results
    assert {"test2016_bleu", "test2017_bleu"} <= set(results) and "test_bleu" not in results
    for stem in ("test2016", "test2017"):
        assert len(run_dir.hypothesis_path(tmp_path / "run", stem).read_text(encoding="utf-8").splitlines()) == 2


def test_overflowing_mixed_float16_steps_are_skipped_counted_and_keep_checkpoint_numbering(
        toy_data, tmp_path, monkeypatch):
    """Issue #19: under mixed_float16 (GPUs), loss scaling skips a step whose gradients
    overflow without advancing `optimizer.iterations`, which numbers our checkpoints:
    rounds would end off their multiples and averaging find none. Forced here on CPU with
    a loss scale of 2^40 (every step overflows float16): each step is skipped and counted,
    the weights stay at their initial values, and checkpoints and averaging are as usual."""
    from keras_transformer import training

    monkeypatch.setattr(training, "mixed_precision_policy", lambda: "mixed_float16")
    monkeypatch.setattr(training, "INITIAL_LOSS_SCALE", 2.0 ** 40)
    try:
        trained = train_and_evaluate(run_config(toy_data, tmp_path / "run", steps=6, checkpoint_every=2,
                                                average=2, mixed_precision=True))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert (trained.results["steps"], trained.results["skipped_steps"], trained.results["averaged_checkpoints"]) == (
        6, 6, 2)
    assert [int(row["step"]) for row in run_dir.read_history(tmp_path / "run")] == [2, 4, 6]
    assert sorted(p.name for p in (tmp_path / "run" / run_dir.CHECKPOINT_DIR).glob("*.index")) == [
        "ckpt-2.index", "ckpt-4.index", "ckpt-6.index"]
    keras.utils.set_random_seed(0)  # the run's seed: the weights it started from
    initial = keras_transformer.build_transformer(trained.config)
    for got, want in zip(trained.model.get_weights(), initial.get_weights()):
        np.testing.assert_array_equal(got, want)


def test_counting_loss_scale_optimizer_applies_finite_steps_and_counts_skipped_ones():
    from keras_transformer.schedule import CountingLossScaleOptimizer

    variable = keras.Variable(np.ones(3, "float32"))
    optimizer = CountingLossScaleOptimizer(keras.optimizers.SGD(learning_rate=0.5), initial_scale=4.0)
    optimizer.build([variable])
    optimizer.apply([np.full(3, 4.0, "float32")], [variable])  # scaled by 4: an unscaled gradient of 1
    np.testing.assert_allclose(variable.numpy(), 0.5)
    optimizer.apply([np.array([1.0, np.inf, 1.0], "float32")], [variable])  # overflow: skipped
    np.testing.assert_allclose(variable.numpy(), 0.5)
    assert (int(optimizer.iterations.numpy()), int(optimizer.skipped_steps.numpy())) == (2, 1)
    assert float(optimizer.dynamic_scale.numpy()) == 2.0


def test_stop_waits_for_the_checkpoint_of_a_rounds_last_step():
    signals = StopSignals()
    guard = StepGuard(signals)
    guard.set_params({"steps": 5})
    guard.on_train_batch_end(2, {"loss": 1.0})  # no signal yet
    signals.received = "SIGTERM"
    guard.on_train_batch_end(4, {"loss": 1.0})  # last step of the round: its checkpoint comes first
    with pytest.raises(Interrupted):
        guard.on_epoch_begin(1)
    with pytest.raises(Interrupted):
        guard.on_train_batch_end(2, {"loss": 1.0})


def test_signal_checkpoint_is_not_averaged():
    class Store:
        paths = ["d/ckpt-10", "d/ckpt-20", "d/ckpt-23", "d/ckpt-30", "d/ckpt-40", "d/ckpt-45"]

    assert averaged_checkpoints(Store, every=10, steps=45, count=3) == ["d/ckpt-30", "d/ckpt-40", "d/ckpt-45"]
    assert averaged_checkpoints(Store, every=10, steps=45, count=5) == [
        "d/ckpt-10", "d/ckpt-20", "d/ckpt-30", "d/ckpt-40", "d/ckpt-45"]


def test_target_tokens_counts_real_tokens():
    metric = TargetTokens()
    y = np.array([[5, 6, PAD_ID], [7, PAD_ID, PAD_ID]])
    metric.update_state(y, None)
    metric.update_state(np.array([[9, 9, 9]]), None)
    assert float(metric.result()) == 6.0


def test_progress_figures(monkeypatch):
    import io

    import tensorflow as tf

    # begin, epoch, then per batch: the rate's reading and the ETA's reading.
    clock = iter([100.0, 100.0, 101.0, 101.0, 103.0, 103.0, 105.0, 105.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    stream = io.StringIO()
    progress = Progress(total_steps=10, live=True, stream=stream)
    iterations = tf.Variable(0, dtype=tf.int64)
    progress.set_model(type("M", (), {"optimizer": type("O", (), {"iterations": iterations})()})())
    progress.on_train_begin()  # t=100, step 0
    progress.on_epoch_begin(0)  # t=100
    for batch, (tokens, step) in enumerate([(500.0, 1), (1500.0, 2), (2500.0, 3)]):
        iterations.assign(step)
        progress.on_train_batch_end(batch, {"loss": 2.5, "target_tokens": tokens})
    # Batch 0 (tracing) is not timed; then 1000 tokens in 2 s, twice.
    assert progress.tokens_per_second == pytest.approx(500.0)
    text = stream.getvalue()
    assert text.startswith("\rstep 1/10 [==")
    last = text.rsplit("\r", 1)[1]
    # 3 steps in 5 s (t=100 -> 105), 7 steps to go -> ETA 11.7 s.
    assert last.startswith("step 3/10 [=======                 ]  loss 2.5000  500 tok/s  ETA 0:11")


def test_readme_option_table_is_the_generated_one():
    """Issue #18: each option is defined once (on its config field); the README's table is
    made from those definitions. Regenerate it with
    python -c "from keras_transformer.config import options_table; print(options_table())"."""
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    table = readme.split("<!-- options:begin -->\n", 1)[1].split("\n<!-- options:end -->", 1)[0]
    assert table == options_table()


def test_options_cover_every_field_and_show_each_presets_default(capsys):
    """Every TrainingConfig field is a flag (syntax and model through their own flags),
    with its help and, where the presets differ, each preset's default as `create` makes it."""
    import dataclasses

    import train

    options = {item.field: item for item in command_line_options()}
    fields = {f.name for f in dataclasses.fields(TrainingConfig)} - {"syntax", "model"}
    assert set(options) == fields | set(SYNTAX_FIELDS)
    assert all(item.help for item in options.values())
    steps = options["steps"].default
    for preset, config in PRESETS.items():
        assert f"{preset} {config.train_steps}" in steps, steps
    assert options["max_minutes"].default == f"0 (multi30k {TRAINING_DEFAULTS['multi30k']['max_minutes']:g})"
    assert options["preset"].flag == "--config" and options["preset"].choices == tuple(PRESETS)
    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for item in options.values():
        assert item.flag in help_text
    assert f"(default: {options['steps'].default})" in help_text


@pytest.mark.parametrize("field", ["steps", "batch_tokens", "vocab_size", "max_length", "checkpoint_every",
                                   "keep_checkpoints", "average", "beam_size"])
def test_a_bad_value_names_its_flag_through_the_fields_config_error(field, capsys):
    """`ConfigError.field` names the field; train.py turns it into its flag, for every
    positive-integer option (no message parsing)."""
    import train

    flag = "--" + field.replace("_", "-")
    with pytest.raises(ConfigError) as error:
        TrainingConfig.create("tiny", **{field: 0})
    assert error.value.field == field
    with pytest.raises(SystemExit) as exit_:
        train.parse_args([flag, "0"])
    assert exit_.value.code == 2
    line = capsys.readouterr().err.strip()
    assert f"error: {flag} must be a positive integer, got 0" in line or f"error: {flag}: " in line, line
