"""keras_transformer.training in process: seeds, NaN guard, data fingerprint,
resume, every test set scored, mixed precision, checkpoints at stop signals and
their averaging. Runs use a train-only toy corpus (no validation split, so no BLEU
decoding) and a few steps of `tiny`. The pieces on their own: test_config.py,
test_callbacks.py, test_stop_signals.py, test_schedule.py, test_losses.py."""

import dataclasses
import json
import logging
import time

import keras
import numpy as np
import pytest
from helpers import WORDS_DE, WORDS_EN, fixture_seed

import keras_transformer
from keras_transformer import run_dir
from keras_transformer.config import TrainingConfig
from keras_transformer.run_dir import RunError
from keras_transformer.training.callbacks import NonFiniteLossError, StepGuard
from keras_transformer.training.run import averaged_checkpoints, train_and_evaluate
from keras_transformer.training.stop_signals import Interrupted, StopSignals


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


def test_seed_gives_identical_runs_from_scratch(toy_data, tmp_path):
    first = train_and_evaluate(run_config(toy_data, tmp_path / "a", seed=fixture_seed(3)))
    second = train_and_evaluate(run_config(toy_data, tmp_path / "b", seed=fixture_seed(3)))
    other = train_and_evaluate(run_config(toy_data, tmp_path / "c", seed=fixture_seed(4)))
    assert history_losses(tmp_path / "a") == history_losses(tmp_path / "b")
    for a, b in zip(first.model.get_weights(), second.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert history_losses(tmp_path / "a") != history_losses(tmp_path / "c")
    assert first.results["steps"] == 4


def poisoned_optimizer(from_step):
    """`make_optimizer` whose learning rate is NaN from update `from_step` on."""
    from keras import ops

    from keras_transformer.training.schedule import TransformerSchedule

    class Poisoned(keras.optimizers.schedules.LearningRateSchedule):
        def __init__(self, base):
            self.base = base

        def __call__(self, iteration):  # 0-based: update k runs with iteration k - 1
            return ops.where(iteration >= from_step - 1, float("nan"), self.base(iteration))

    def make(config, accumulate=1):
        return keras.optimizers.Adam(Poisoned(TransformerSchedule(config.d_model, config.warmup_steps)),
                                     beta_1=0.9, beta_2=0.98, epsilon=1e-9,
                                     gradient_accumulation_steps=accumulate if accumulate > 1 else None)

    return make


@pytest.mark.parametrize("every, poisoned_step, caught", [
    (2, 5, "the training loss became nan at step 6"),  # the loss after the bad update
    (5, 10, "the weights hold NaN or infinite values at step 10"),  # bad update right at a checkpoint
])
def test_nan_stops_training_and_keeps_the_last_good_checkpoint(toy_data, tmp_path, monkeypatch,
                                                               every, poisoned_step, caught):
    from keras_transformer.training.checkpoints import CheckpointStore

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
    optimizer = keras_transformer.make_optimizer(config)
    optimizer.build(model.trainable_variables)
    from keras_transformer.data import Tokenizer, tokenizer_path

    store = CheckpointStore(model_dir / run_dir.CHECKPOINT_DIR, model, optimizer,
                            Tokenizer.load(tokenizer_path(model_dir)).sha256)
    assert store.paths[-1].endswith(f"ckpt-{good}")
    assert store.restore_latest() == good
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_resume_on_changed_data_needs_allow_data_change(tmp_path, caplog):
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
    # The new data is now the run's: resuming again needs no flag. With a --steps below the step
    # the run reached it trains nothing, and says so (it said "3 steps ...; resuming at step 4").
    with caplog.at_level(logging.INFO, logger="keras_transformer.training"):
        again = train_and_evaluate(run_config(data, model_dir, steps=3))
    assert again.results["steps"] == 4 and [int(r["step"]) for r in run_dir.read_history(model_dir)] == [2, 4]
    assert ("the run is at step 4, past --steps 3: nothing to train; it is averaged and evaluated as it "
            "is") in caplog.messages


def test_the_same_data_at_another_path_resumes_without_allow_data_change(tmp_path, caplog, monkeypatch):
    """corpora.fingerprint is what the data holds, not where it lives: a run resumes on its
    files moved, or copied to a job's local disk, given by another path (an absolute one for a
    relative one too); run.json then records the new path. Other files at the new path are
    still a change."""
    import shutil

    data = write_train_only(tmp_path / "data")
    model_dir = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    train_and_evaluate(run_config("data", model_dir, steps=2))  # a relative path
    moved = tmp_path / "scratch" / "copy"
    shutil.copytree(data, moved)
    with caplog.at_level(logging.INFO, logger="keras_transformer"):
        resumed = train_and_evaluate(run_config(moved, model_dir, steps=4))
    assert resumed.results["steps"] == 4
    assert f"the run's data is at {moved} now (was data): the same files by their sizes and SHA-256" in caplog.messages
    record = json.loads((model_dir / run_dir.RUN_FILE).read_text())
    assert record["data"]["data"] == str(moved) and "previous_data" not in record
    with (moved / "train.de").open("a", encoding="utf-8") as f:
        f.write("der Hund\n")
    with (moved / "train.en").open("a", encoding="utf-8") as f:
        f.write("the dog\n")
    shutil.move(moved, tmp_path / "elsewhere")
    with pytest.raises(RunError, match=r"the existing run was trained on .*; pass --allow-data-change"):
        train_and_evaluate(run_config(tmp_path / "elsewhere", model_dir, steps=6))


def test_a_second_train_py_on_a_run_directory_in_use_is_refused(toy_data, tmp_path, monkeypatch):
    """Two train.py processes on one --model-dir (a job restarted while the first still runs)
    both wrote checkpoints, history and results into the same run. The chief now holds an
    flock on MODEL_DIR/.train.lock (the kernel drops it when the process ends, a kill -9
    too, which test_train's interrupted run goes through); a second is refused in one line
    before it writes anything. (A second open of the file conflicts within one process too.)"""
    from keras_transformer import console
    from keras_transformer.training import run as training

    model_dir = tmp_path / "run"
    model_dir.mkdir()
    held = run_dir.ModelDirLock(model_dir)  # what the first train.py holds
    with pytest.raises(RunError, match=rf"^another train.py is training in {model_dir} \(pid \d+ since "
                                       rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\); wait for it to end"):
        train_and_evaluate(run_config(toy_data, model_dir, steps=1, max_length=12, beam_size=1))
    assert sorted(p.name for p in model_dir.iterdir()) == [run_dir.LOCK_FILE]  # nothing written
    held.release()

    # The same run, now alone. Its console quiet with oneDNN on, it meets TensorFlow's
    # once-per-process oneDNN fallback notice in `console.say_onednn_fallback`, before `fit`,
    # not among the first round's lines (test_console checks that the notice is then dropped).
    events = []
    monkeypatch.setattr(console, "onednn_state", lambda: "on")
    monkeypatch.setattr(console, "say_onednn_fallback", lambda: events.append("said"))
    real_train = training._train
    monkeypatch.setattr(training, "_train", lambda *args: events.append("fit") or real_train(*args))
    monkeypatch.setenv("KERAS_TRANSFORMER_QUIET", "1")
    assert train_and_evaluate(run_config(toy_data, model_dir, steps=1, max_length=12, beam_size=1)
                              ).results["steps"] == 1
    assert events == ["said", "fit"]
    run_dir.ModelDirLock(model_dir).release()  # the run released it when it ended


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
    the weights stay at their initial values, and checkpoints and averaging are as usual.
    A narrower model than `tiny`'s: on a CPU with AVX512-FP16 (an Intel Xeon with AMX),
    oneDNN runs TensorFlow's float16 Dense layers in its reference kernel (`ref:any` with
    ONEDNN_VERBOSE=1), 134 ms for one 256x128x128 product, and the six steps took 28 s at
    d_model 128 against 5.6 s in float32. What is checked does not depend on the width."""
    from keras_transformer.training import run as training

    monkeypatch.setattr(training, "mixed_precision_policy", lambda: "mixed_float16")
    monkeypatch.setattr(training, "INITIAL_LOSS_SCALE", 2.0 ** 40)
    try:
        trained = train_and_evaluate(run_config(toy_data, tmp_path / "run", steps=6, checkpoint_every=2,
                                                average=2, mixed_precision=True,
                                                model={"d_model": 32, "d_ff": 64, "num_heads": 2}))
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


def test_a_tokenizer_put_in_the_run_directory_before_the_first_run_is_the_runs(toy_data, tmp_path, caplog):
    """docs/data.md, "The tokenizer": a SentencePiece model of one's own (trained with the
    project's ids, here on other text than the run's) put at MODEL_DIR/tokenizer.model before
    the first run is the run's tokenizer: kept byte for byte, recorded in run.json, the model's
    vocabulary its size rather than --vocab-size's, and said in the log."""
    import hashlib

    from keras_transformer.data import Tokenizer, train_tokenizer

    own = train_tokenizer([" ".join(WORDS_EN[i:] + WORDS_DE[:i]) for i in range(len(WORDS_EN))] * 4,
                          tmp_path / "own" / "tokenizer", vocab_size=70)
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "tokenizer.model").write_bytes(own.read_bytes())
    with caplog.at_level(logging.INFO, logger="keras_transformer"):
        trained = train_and_evaluate(run_config(toy_data, model_dir, steps=2, checkpoint_every=2,
                                                model={"d_model": 32, "d_ff": 64, "num_heads": 2}))
    assert (model_dir / "tokenizer.model").read_bytes() == own.read_bytes()
    size = Tokenizer.load(own).vocab_size
    assert size != 60  # run_config's --vocab-size
    assert trained.config.vocab_size == size
    assert json.loads((model_dir / "run.json").read_text())["tokenizer_sha256"] == hashlib.sha256(
        own.read_bytes()).hexdigest()
    assert f"tokenizer {model_dir / 'tokenizer.model'}: {size} pieces, the run's own" in caplog.text


def test_a_run_started_from_another_runs_weights_fine_tunes_them_with_a_new_optimizer(toy_data, tmp_path, caplog):
    """`--init-from` (docs/training.md, "Fine-tuning a trained model"): a run on other data
    starts from the initial run's averaged weights, with its tokenizer (copied) and model,
    and a new optimizer and schedule (step 0). At a rate of 1e-30 no weight moves (each Adam
    step is under a float32 weight's spacing), so the tuned weights are the initial run's bit
    for bit: a run that started from new weights or a checkpoint fails it. The run resumes
    without the flag (run.json records it); other initial runs, and one that has not
    finished, are refused in one line before anything is written."""
    import shutil

    from keras_transformer import TransformerSchedule

    narrow = {"d_model": 32, "d_ff": 64, "num_heads": 2}
    first_dir, tuned_dir = tmp_path / "first", tmp_path / "tuned"
    first = train_and_evaluate(run_config(toy_data, first_dir, steps=4, checkpoint_every=2, average=2, model=narrow))
    other = write_train_only(tmp_path / "other", pairs=120, seed=fixture_seed(1))
    tuning = {"learning_rate_scale": 1e-30, "dropout": 0.0}
    with caplog.at_level(logging.INFO, logger="keras_transformer"):
        tuned = train_and_evaluate(run_config(other, tuned_dir, steps=2, checkpoint_every=1, average=1,
                                              init_from=str(first_dir), model=tuning))
    for initial, weights in zip(first.model.get_weights(), tuned.model.get_weights(), strict=True):
        np.testing.assert_array_equal(weights, initial)
    optimizer = tuned.model.optimizer
    assert int(optimizer.iterations.numpy()) == 2 and tuned.results["steps"] == 2
    schedule = TransformerSchedule(first.config.d_model, first.config.warmup_steps, 1e-30)
    assert float(optimizer.learning_rate) == pytest.approx(float(schedule(2)), rel=1e-6)
    assert tuned.config == dataclasses.replace(first.config, train_steps=2, checkpoints_to_average=1, **tuning)
    assert (tuned_dir / "tokenizer.model").read_bytes() == (first_dir / "tokenizer.model").read_bytes()
    record = json.loads((tuned_dir / "run.json").read_text())
    assert (record["init_from"], record["data"]["data"]) == (str(first_dir.resolve()), str(other))
    assert f"weights: {first_dir.resolve() / 'final.weights.h5'} (the initial run's averaged weights)" in caplog.text

    caplog.clear()
    first_dir.rename(tmp_path / "gone")  # a resumed run no longer reads the initial one
    with caplog.at_level(logging.INFO, logger="keras_transformer"):  # resumed without the flag
        resumed = train_and_evaluate(run_config(other, tuned_dir, steps=3, checkpoint_every=1, average=1, model=tuning))
    (tmp_path / "gone").rename(first_dir)
    assert resumed.results["steps"] == 3
    assert [int(row["step"]) for row in run_dir.read_history(tuned_dir)] == [1, 2, 3]
    assert f"the run started from the weights of {first_dir.resolve()} (run.json)" in caplog.text
    assert "the initial run's averaged weights" not in caplog.text

    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    for name in ("run.json", "tokenizer.model"):
        shutil.copy(first_dir / name, unfinished / name)
    refusals = [
        (tuned_dir, unfinished, {}, f"{tuned_dir} holds a run started from {first_dir.resolve()}, not from "
                                    f"{unfinished.resolve()}: leave out --init-from to resume it, or use a new --model-dir"),
        (tmp_path / "new", unfinished, {}, f"--init-from {unfinished}: {unfinished.resolve() / 'final.weights.h5'} not "
                                           f"found: that run has not finished (train.py writes its averaged weights "
                                           f"when training ends); run its command again to finish it"),
        (tmp_path / "new", first_dir, {"num_heads": 4}, f"--init-from {first_dir}: the model is the initial run's, so "
                                                        f"num_heads=4 (it has 2) cannot be set; a fine-tuning run may set "
                                                        f"dropout, attention_dropout, label_smoothing, "),
        (first_dir, first_dir, {}, f"--init-from {first_dir} is the --model-dir itself: to resume the run there, leave "
                                   f"out --init-from")]
    for model_dir, init_from, model, message in refusals:
        with pytest.raises(RunError) as error:
            train_and_evaluate(run_config(other, model_dir, steps=2, init_from=str(init_from), model=model))
        assert str(error.value).startswith(message)
    assert {path.name for path in (tmp_path / "new").iterdir()} <= {run_dir.LOCK_FILE}  # nothing of a run written


def test_out_of_memory_is_one_line_naming_the_step_the_checkpoint_and_the_flags_that_fit(
        toy_data, tmp_path, monkeypatch):
    """A GPU out of memory in `fit` (TensorFlow's ResourceExhaustedError, raised here where
    `fit` would raise it) is one line: the step, --batch-tokens, TensorFlow's first line, the
    newest checkpoint and the flags that keep each update's tokens in smaller batches. At the
    first step there is no checkpoint: the advised command then trains, and run.json records it. Later, the checkpoint is kept and the
    same flags resume from it (test_accumulated_runs_count_updates_and_resume_with_another_accumulation)."""
    import tensorflow as tf

    from keras_transformer.training import run as training

    real_fit = training._fit
    calls = []

    def fit_out_of_memory_at(call):
        def fit(*args, **kwargs):
            calls.append(call)
            if len(calls) == call:
                raise tf.errors.ResourceExhaustedError(
                    None, None, "OOM when allocating tensor with shape[256,60] and type float on "
                    "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n[[{{node x}}]]")
            return real_fit(*args, **kwargs)
        return fit

    narrow = {"d_model": 32, "d_ff": 64, "num_heads": 2}
    model_dir = tmp_path / "run"
    monkeypatch.setattr(training, "_fit", fit_out_of_memory_at(1))
    with pytest.raises(RunError) as error:
        train_and_evaluate(run_config(toy_data, model_dir, steps=3, checkpoint_every=2, model=narrow))
    assert str(error.value) == (
        "out of memory in training at step 0 with --batch-tokens 256 (OOM when allocating tensor with "
        "shape[256,60] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc); "
        "no checkpoint was written: rerun with --batch-tokens 128 --accumulate 2: each update keeps its 256 "
        "tokens in batches half as big")
    monkeypatch.setattr(training, "_fit", real_fit)
    trained = train_and_evaluate(TrainingConfig.create(
        "tiny", data=str(toy_data), model_dir=str(model_dir), vocab_size=60, batch_tokens=128, bleu_every_sentences=0,
        steps=3, checkpoint_every=2, accumulate=2, model=narrow))
    assert (trained.results["steps"], int(trained.model.optimizer._iterations.numpy())) == (3, 6)
    assert json.loads((model_dir / "run.json").read_text())["accumulate"] == 2

    calls.clear()
    monkeypatch.setattr(training, "_fit", fit_out_of_memory_at(2))  # the round after ckpt-2
    with pytest.raises(RunError) as error:
        train_and_evaluate(run_config(toy_data, tmp_path / "later", steps=3, checkpoint_every=2, model=narrow))
    assert "\n" not in str(error.value)
    assert str(error.value).startswith("out of memory in training at step 2 with --batch-tokens 256 (OOM when")
    assert str(error.value).endswith(
        "the newest checkpoint is ckpt-2: rerun with --batch-tokens 128 --accumulate 2 to resume from ckpt-2: each "
        "update keeps its 256 tokens in batches half as big")


def test_with_accumulation_a_stop_waits_for_the_last_batch_of_its_update():
    """`--accumulate 3`: a signal after an update's first or second batch waits for its
    third, so that the checkpoint written at the stop holds no half-accumulated gradients."""
    signals = StopSignals()
    guard = StepGuard(signals, accumulate=3)
    guard.set_params({"steps": 12})
    signals.received = "SIGTERM"
    guard.on_train_batch_end(3, {"loss": 1.0})  # the second update's first batch
    guard.on_train_batch_end(4, {"loss": 1.0})
    with pytest.raises(Interrupted):
        guard.on_train_batch_end(5, {"loss": 1.0})  # its last: two updates done


def test_accumulated_runs_count_updates_and_resume_with_another_accumulation(toy_data, tmp_path):
    """`--accumulate 2`: `--steps`, `--checkpoint-every`, the history and the checkpoints
    count updates, each of which read two batches (Keras's batch counter: twice the
    updates); the learning rate is the schedule's at the update count. The run then goes on
    with `--accumulate 1` and `3` (fewer GPUs, or half the batch after running out of
    memory): from its update count, the batch counter that count times the new K, run.json
    recording the value in use."""
    from keras_transformer import TransformerSchedule

    narrow = {"d_model": 32, "d_ff": 64, "num_heads": 2}
    trained = train_and_evaluate(run_config(toy_data, tmp_path / "run", steps=4, checkpoint_every=2, average=2,
                                            accumulate=2, model=narrow))
    optimizer = trained.model.optimizer
    assert (trained.results["steps"], int(optimizer.iterations.numpy()), int(optimizer._iterations.numpy())) == (4, 4, 8)
    assert [int(row["step"]) for row in run_dir.read_history(tmp_path / "run")] == [2, 4]
    assert sorted(p.name for p in (tmp_path / "run" / run_dir.CHECKPOINT_DIR).glob("*.index")) == [
        "ckpt-2.index", "ckpt-4.index"]
    schedule = TransformerSchedule(trained.config.d_model, trained.config.warmup_steps)
    assert float(optimizer.learning_rate) == pytest.approx(float(schedule(4)), rel=1e-6)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["accumulate"] == 2
    for steps, accumulate in ((6, 1), (8, 3)):
        resumed = train_and_evaluate(run_config(toy_data, tmp_path / "run", steps=steps, checkpoint_every=2, average=2,
                                                accumulate=accumulate, model=narrow))
        optimizer = resumed.model.optimizer
        assert (resumed.results["steps"], int(optimizer._iterations.numpy())) == (steps, steps * accumulate)
        assert float(optimizer.learning_rate) == pytest.approx(float(schedule(steps)), rel=1e-6)
        assert json.loads((tmp_path / "run" / "run.json").read_text()).get("accumulate", 1) == accumulate
    assert [int(row["step"]) for row in run_dir.read_history(tmp_path / "run")] == [2, 4, 6, 8]


def test_a_resumed_part_reads_a_fresh_shuffle_of_the_training_data(toy_data, tmp_path, monkeypatch):
    """docs/training.md, "Checkpoints and resume": each part of a run reads its own shuffle of
    the training data, seeded by the run's seed and the step it resumes from (`data_seed`),
    where every part had read the first part's batches again from the first (a run trained in
    parts shorter than an epoch saw only those). A part's first batch is the first of
    `make_batches` with that seed; a run from scratch keeps the run's seed (its numbers unchanged).
    Its dropout masks are fresh as well (`reseed_dropout`)."""
    import tensorflow as tf

    from keras_transformer.data import Tokenizer, load_corpus, make_batches
    from keras_transformer.training import run as training
    from keras_transformer.training.run import data_seed

    real_fit = training._fit
    firsts = []

    seeds = []  # each part's dropout seed generators' states as it starts training

    def fit(model, train_ds, **kwargs):
        firsts.append([np.asarray(part) for part in tf.nest.flatten(next(iter(train_ds)))])
        seeds.append([v.numpy() for v in model.variables if v.path.endswith("seed_generator_state")])
        return real_fit(model, train_ds, **kwargs)

    monkeypatch.setattr(training, "_fit", fit)
    narrow = {"d_model": 32, "d_ff": 64, "num_heads": 2}
    model_dir = tmp_path / "run"
    train_and_evaluate(run_config(toy_data, model_dir, steps=2, checkpoint_every=2, average=1, model=narrow))
    trained = train_and_evaluate(run_config(toy_data, model_dir, steps=4, checkpoint_every=2, average=1, model=narrow))
    assert trained.results["steps"] == 4 and len(firsts) == 2

    corpus = load_corpus(str(toy_data), "en", "de", seed=0)
    tokenizer = Tokenizer.load(model_dir / "tokenizer.model")

    def first_batch(seed):
        batches = make_batches(corpus.dataset("train"), tokenizer, batch_tokens=256, max_length=trained.config.max_length,
                               shuffle=True, seed=seed, repeat=True, batch_multiple=1)
        return [np.asarray(part) for part in tf.nest.flatten(next(iter(batches)))]

    assert (data_seed(0, 0), data_seed(5, 0)) == (0, 5)
    assert len({data_seed(0, 2), data_seed(0, 4), data_seed(1, 2), 0, 1, 2}) == 6
    assert all(0 <= data_seed(seed, step) < 2 ** 32 for seed in (0, 2 ** 32 - 1) for step in (1, 10 ** 9))
    for seen, expected in ((firsts[0], first_batch(0)), (firsts[1], first_batch(data_seed(0, 2)))):
        assert len(seen) == len(expected)
        for a, b in zip(seen, expected):
            np.testing.assert_array_equal(a, b)
    assert any(a.shape != b.shape or (a != b).any() for a, b in zip(firsts[0], firsts[1]))
    # Fresh dropout masks too: the checkpoints do not hold Keras's seed generators' states,
    # so the resumed part's model started from the seeds it was built with, the first part's,
    # and drew its masks again. Now every generator starts the part from a seed of its own.
    assert len(seeds[0]) == len(seeds[1]) >= 5  # (embedding and residual dropouts)
    assert all(state[1] == 0 for part in seeds for state in part)
    firsts_seeds = {int(state[0]) for state in seeds[0]}
    resumed_seeds = {int(state[0]) for state in seeds[1]}
    assert len(resumed_seeds) == len(seeds[1]) and not firsts_seeds & resumed_seeds


def test_early_stopping_stops_after_rounds_without_a_lower_validation_loss_and_across_resumes(toy_data, tmp_path,
                                                                                                capsys):
    """`--early-stopping 2`: at a rate of 1e-30 the weights move by some 1e-35 (the zero
    biases) or not at all, so the validation loss of every round, to the 4 decimals history.csv
    keeps, equals the first's (no improvement, by construction): training stops after
    round 3, is averaged, evaluated and reports it. The same command again trains nothing
    (history.csv says it stopped); a larger patience goes on to its own stop. A corpus
    without validation data is refused in one line."""
    from helpers import write_corpus

    data = write_corpus(tmp_path / "data", pairs=160, valid=4)
    model_dir = tmp_path / "run"
    flags = dict(steps=10, checkpoint_every=1, average=2, early_stopping=2, beam_size=1,  # (a quick final BLEU)
                 model={"d_model": 32, "d_ff": 64, "num_heads": 2, "learning_rate_scale": 1e-30})
    trained = train_and_evaluate(run_config(data, model_dir, **flags))
    history = run_dir.read_history(model_dir)
    assert [int(row["step"]) for row in history] == [1, 2, 3]
    assert len({row["val_loss"] for row in history}) == 1
    stop = {"step": 3, "best_step": 1, "patience": 2}
    assert trained.results["steps"] == 3 and trained.results["stopped_early"] == stop
    assert trained.results["averaged_checkpoints"] == 2 and "valid_bleu" in trained.results
    assert ("early stopping: the validation loss has not improved for 2 checkpoints (best at step 1); stopping at "
            "step 3") in capsys.readouterr().out
    again = train_and_evaluate(run_config(data, model_dir, **flags))
    assert again.results["steps"] == 3 and again.results["stopped_early"] == stop
    assert len(run_dir.read_history(model_dir)) == 3
    # It trained nothing, so it adds no minutes: the training's, as history.csv records them
    # (each rerun once added its own start-up, averaging and evaluation).
    assert again.results["train_minutes"] == round(float(history[-1]["minutes"]), 2)
    longer = train_and_evaluate(run_config(data, model_dir, **{**flags, "early_stopping": 4}))
    assert [int(row["step"]) for row in run_dir.read_history(model_dir)] == [1, 2, 3, 4, 5]
    assert longer.results["stopped_early"] == {"step": 5, "best_step": 1, "patience": 4}
    with pytest.raises(RunError, match=f"^--early-stopping 2 watches the validation loss, and {toy_data} has no "
                                       f"validation data$"):
        train_and_evaluate(run_config(toy_data, tmp_path / "no-valid", steps=2, early_stopping=2))


def test_signal_checkpoint_is_not_averaged():
    class Store:
        paths = ["d/ckpt-10", "d/ckpt-20", "d/ckpt-23", "d/ckpt-30", "d/ckpt-40", "d/ckpt-45"]

    assert averaged_checkpoints(Store, every=10, steps=45, count=3) == ["d/ckpt-30", "d/ckpt-40", "d/ckpt-45"]
    assert averaged_checkpoints(Store, every=10, steps=45, count=5) == [
        "d/ckpt-10", "d/ckpt-20", "d/ckpt-30", "d/ckpt-40", "d/ckpt-45"]


def test_rounds_validate_on_the_whole_validation_set_without_kerass_ran_out_of_data_warning():
    """`train_and_evaluate`'s `fit` calls (`_fit`) on a validation set of unknown length, as
    `make_batches`' are: no "Your input ran out of data" warning (Keras <= 3.15.1 gave it at
    the end of every such set, which a program of one's own calling `train_and_evaluate`
    printed), and the validation loss is that of every validation batch: `evaluate`'s on the
    same set with the trained weights."""
    import warnings

    import keras
    import tensorflow as tf

    from keras_transformer.training.run import _fit

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)).astype("float32"), rng.normal(size=(40, 1)).astype("float32")
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat()
    valid = tf.data.Dataset.from_tensor_slices((x[:22], y[:22])).filter(lambda a, b: True).batch(4)
    assert int(valid.cardinality()) == tf.data.UNKNOWN_CARDINALITY  # as make_batches' (bucketing, filters)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(model, train, epochs=2, steps_per_epoch=3, validation_data=valid, verbose=0, shuffle=False)
    assert not [str(w.message) for w in caught if "ran out of data" in str(w.message)]
    whole = float(np.mean((model.predict(x[:22], verbose=0) - y[:22]) ** 2))
    assert model.history.history["val_loss"][-1] == pytest.approx(whole, rel=1e-5)
    assert model.history.history["val_loss"][-1] != pytest.approx(
        float(np.mean((model.predict(x[:20], verbose=0) - y[:20]) ** 2)), rel=1e-5)  # (the last batch counts)


def test_validation_batches_are_the_pipelines_own_with_autotuning_off(toy_data, tmp_path, caplog):
    """Keras's evaluate deletes the last round's validation iterator every round, and with
    tf.data's autotuning on that deletion sometimes waited ~44 s, idle (training._validation_options):
    the validation batches are made with autotuning off, and are the same batches, number for
    number, as the pipeline gives without the options. A directory without validation files
    trains without them, as it did, but now says so (a dev set under another name, such as
    `newstest2013.en`, had been left out in silence)."""
    import logging
    import shutil

    import tensorflow as tf

    from keras_transformer.data import Tokenizer, load_corpus, make_batches, train_tokenizer
    from keras_transformer.training.run import _make_datasets

    data = tmp_path / "data"
    shutil.copytree(toy_data, data)
    run = run_config(data, tmp_path / "run")
    corpus = load_corpus(str(data), seed=0)
    tokenizer = Tokenizer.load(train_tokenizer(corpus.texts("train"), tmp_path / "tokenizer", 60))
    config = run.model_config(tokenizer.vocab_size)
    with caplog.at_level(logging.WARNING, logger="keras_transformer.training"):
        datasets = _make_datasets(run, corpus, tokenizer, config, 1)
    assert datasets.valid is None and datasets.valid_split is None
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{data} has no validation data (looked for valid.en or dev.en or val.en or validation.en with its .de): "
        "this run has no validation loss, no BLEU curve and no validation BLEU"]
    caplog.clear()
    for lang in ("en", "de"):  # TFDS's name for the split is taken too
        lines = (toy_data / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        (data / f"validation.{lang}").write_text("\n".join(lines[:40]) + "\n", encoding="utf-8")
    corpus = load_corpus(str(data), seed=0)
    with caplog.at_level(logging.WARNING, logger="keras_transformer.training"):
        valid = _make_datasets(run, corpus, tokenizer, config, 1).valid
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    assert valid.options().autotune.enabled is False
    plain = make_batches(corpus.dataset("valid"), tokenizer, batch_tokens=run.batch_tokens,
                         max_length=config.max_length).cache()
    assert plain.options().autotune.enabled is not False  # the default: what the option changes
    got, want = list(valid.as_numpy_iterator()), list(plain.as_numpy_iterator())
    assert len(got) == len(want) > 1
    for batch, expected in zip(got, want):
        tf.nest.map_structure(np.testing.assert_array_equal, batch, expected)
    assert sum(len(target_output) for _, target_output in got) == 40  # every validation pair


def test_a_vocabulary_smaller_than_asked_is_said_once_when_trained(toy_data, tmp_path, caplog):
    """`--vocab-size` is an upper bound: SentencePiece stops where the training text has no
    more pieces (1,000 asked of the tiny preset gave 9 on a one-pair corpus, said only by the
    config's line). The run says so when it trains the tokenizer, and not when it reuses it."""
    import logging

    from keras_transformer.data import load_corpus
    from keras_transformer.training.run import prepare_tokenizer

    corpus = load_corpus(str(toy_data), seed=0)
    for asked, directory, said in ((1000, "a", True), (40, "b", False), (1000, "b", False)):  # the last reuses b's
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="keras_transformer.training"):
            tokenizer = prepare_tokenizer(tmp_path / directory, corpus, asked, seed=0)
        messages = [r.getMessage() for r in caplog.records if "pieces:" in r.getMessage()]
        if said:
            assert 40 < tokenizer.vocab_size < 1000
            assert messages == [f"the vocabulary has {tokenizer.vocab_size} pieces: the training text holds "
                                f"fewer than the 1000 asked"]
        else:
            assert tokenizer.vocab_size == 40 and messages == []


# /proc/cpuinfo lines of the two kinds of 2-vCPU AMD EPYC VM this project measures on, cut to
# the flags that matter, and of an Arm CPU with BF16.
AVX2_FLAGS = ("flags\t\t: fpu vme de pse tsc msr sse sse2 ht syscall nx fma cx16 sse4_1 sse4_2 avx f16c "
              "avx2 smep bmi2 erms invpcid rdseed adx sha_ni vaes vpclmulqdq rdpid fsrm")
AVX512_BF16_FLAGS = ("flags\t\t: fpu vme de pse tsc msr sse sse2 fma avx f16c avx2 avx512f avx512dq avx512cd "
                     "avx512bw avx512vl avx512_vnni avx512_bf16 vaes vpclmulqdq")
ARM_BF16_FEATURES = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 i8mm"


@pytest.mark.parametrize("cpuinfo, has_bfloat16", [
    ("processor\t: 0\n" + AVX2_FLAGS + "\nbogomips\t: 5000.00\n", False),
    ("processor\t: 0\n" + AVX512_BF16_FLAGS + "\n", True),
    ("processor\t: 0\n" + ARM_BF16_FEATURES + "\n", True),
    ("processor\t: 0\nBogoMIPS\t: 50.00\n", None),  # no flags: cannot tell, no warning
])
def test_mixed_precision_warns_on_a_cpu_without_bfloat16(cpuinfo, has_bfloat16):
    from keras_transformer.training.run import cpu_has_bfloat16, mixed_precision_warnings

    assert cpu_has_bfloat16(cpuinfo) is has_bfloat16
    warnings = mixed_precision_warnings("mixed_bfloat16", has_bfloat16)
    if has_bfloat16 is False:
        assert len(warnings) == 1
        assert warnings[0].startswith("--mixed-precision: this CPU has no bfloat16 instructions (none of "
                                      "avx512_bf16, amx_bf16, bf16 in /proc/cpuinfo)")
        assert "Drop --mixed-precision on this machine." in warnings[0] and "\n" not in warnings[0]
    else:
        assert warnings == []
    with_xla = mixed_precision_warnings("mixed_bfloat16", has_bfloat16, jit_compile=True)
    assert with_xla[:-1] == warnings
    assert with_xla[-1].startswith("--mixed-precision with --jit-compile on a CPU: XLA undid bfloat16's gain")
    assert with_xla[-1].endswith("Drop --jit-compile.")
    # GPUs: float16 with loss scaling, where neither applies
    assert mixed_precision_warnings("mixed_float16", has_bfloat16, jit_compile=True) == []


def test_a_mixed_precision_run_evaluates_and_returns_its_weights_in_float32(toy_data, tmp_path, monkeypatch,
                                                                              caplog):
    """`--mixed-precision` speeds training up; what it leaves is the float32 model that
    `load_trained` (and `export.saved_model --model-dir`) builds from the same weights:
    train.py exports the returned model, and the run's BLEU is the BLEU of the model
    that `_evaluate` is given. A bfloat16 model returned or evaluated instead fails the
    policy checks (its searches round in bfloat16: docs/lab-notebook, mixed precision on a
    CPU without bfloat16 instructions). The caller's global policy is restored after it."""
    from keras_transformer.training import run as training
    from keras_transformer.run_dir import load_trained

    evaluated = []

    def evaluate(run, translator, data, model_dir):  # toy_data has no valid or test split to score
        evaluated.append(translator.model)
        return {}

    monkeypatch.setattr(training, "cpu_has_bfloat16", lambda: False)
    monkeypatch.setattr(training, "_evaluate", evaluate)
    keras.mixed_precision.set_global_policy("bfloat16")  # the caller's own policy, restored after the run
    try:
        with caplog.at_level("WARNING", logger="keras_transformer.training"):
            trained = train_and_evaluate(run_config(toy_data, tmp_path / "run", steps=2, checkpoint_every=2,
                                                    mixed_precision=True))
        policy_after = keras.mixed_precision.global_policy().name
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert "--mixed-precision: this CPU has no bfloat16 instructions" in caplog.text
    assert policy_after == "bfloat16"
    assert evaluated == [trained.model]
    assert trained.model.dtype_policy.name == "float32"
    assert {layer.dtype_policy.name for layer in trained.model.layers} == {"float32"}
    loaded, _, _ = load_trained(tmp_path / "run")
    assert len(trained.model.get_weights()) == len(loaded.get_weights())
    for got, want in zip(trained.model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(got, want)
