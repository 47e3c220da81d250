"""One training run: corpus -> tokenizer -> batches -> `fit` -> checkpoints ->
averaged weights -> BLEU (TensorFlow-only code, like `data/`).

    from keras_transformer.config import TrainingConfig
    from keras_transformer.training import train_and_evaluate
    run = train_and_evaluate(TrainingConfig.create("tiny", model_dir="runs/x"))
    run.results["test_bleu"]

`fit` runs under `tf.distribute.MirroredStrategy` over all visible GPUs (the
default strategy on one device) in rounds of `checkpoint_every` steps; each
round ends with a checkpoint, a greedy BLEU on a validation subset and a
row of `history.csv`. Re-running resumes from the newest complete checkpoint
(after Ctrl-C, SIGTERM or kill -9 alike). SIGTERM or a first Ctrl-C ends the
current step, writes a checkpoint and returns (`TrainedRun.interrupted`);
a NaN or infinite loss stops training before any checkpoint of its weights is
written (`NonFiniteLossError`). The export is not done here: `train.py`
calls `export.saved_model` with the returned model.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import pathlib
import select
import signal
import sys
import threading
import time

import keras
import numpy as np
import tensorflow as tf

from keras_transformer import run_dir
from keras_transformer.config import TrainingConfig, TransformerConfig
from keras_transformer.constants import PAD_ID

log = logging.getLogger("keras_transformer.training")


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite (one-line message)."""


@dataclasses.dataclass
class TrainedRun:
    """What `train_and_evaluate` leaves: the averaged model and its figures.

    `interrupted` is True when a signal stopped training early (a checkpoint
    was written; the same command resumes); the model then holds the
    weights of that moment, not an average, and nothing was evaluated.
    """

    model: keras.Model
    config: TransformerConfig
    tokenizer: object
    results: dict
    model_dir: pathlib.Path
    interrupted: bool = False
    chief: bool = True  # False for a multi-worker non-chief: nothing to evaluate or export


# -- pieces ----------------------------------------------------------------

def is_multi_worker(strategy) -> bool:
    """Whether `strategy` spans several worker processes (MultiWorkerMirroredStrategy)."""
    extended = getattr(strategy, "extended", None)
    return bool(getattr(extended, "_in_multi_worker_mode", lambda: False)())


def enable_multi_worker_fit(model, strategy) -> None:
    """Makes `model.fit` run under `MultiWorkerMirroredStrategy` (Keras 3.15, TF 2.21).

    Keras's TensorFlow trainer fails there in two places (keras-team/keras#20585):

    1. before the first step, `_maybe_symbolic_build` reduces the first
       distributed batch with `strategy.reduce("MEAN", ...)` to get shapes,
       which the collective strategy cannot do on a per-replica int batch
       ("Attempt to convert a value (PerReplica...) to a Tensor"): here the
       model is built from this worker's first local batch instead (shapes
       are all it needs);
    2. after every step, the step's logs are reduced with
       `strategy.reduce("MEAN", v, axis=0)`, which fails for the scalar loss
       and metrics ("Invalid reduction dimension 0 for input with 0
       dimensions"): here multi-worker "auto"/"mean" reductions of per-replica
       logs use `axis=None` (logs that are plain tensors pass as they are). This patches Keras's module function (private API,
       checked against Keras 3.15.1), only once a multi-worker strategy is used.

    Gradients are all-reduced by the optimizer as usual; with these two
    changes two workers on localhost give the same losses as one process on
    the same global batch (tests/test_training.py).
    """
    if not is_multi_worker(strategy):
        return
    from keras import tree
    from keras.src.backend.tensorflow import trainer as keras_trainer

    def local_first(x):
        return strategy.experimental_local_results(x)[0] if isinstance(x, tf.distribute.DistributedValues) else x

    def build_from_local_batch(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tree.map_structure(local_first, next(batches))
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = build_from_local_batch
    original = keras_trainer.reduce_per_replica
    if getattr(original, "_keras_transformer_patch", False):
        return

    def reduce_per_replica(values, strategy_, reduction):
        if keras_trainer._collective_all_reduce_multi_worker(strategy_) and reduction in ("auto", "mean"):
            return tree.map_structure(
                lambda v: strategy_.reduce("MEAN", v, axis=None) if keras_trainer._is_per_replica_instance(v)
                else v, values)
        return original(values, strategy_, reduction)

    reduce_per_replica._keras_transformer_patch = True
    keras_trainer.reduce_per_replica = reduce_per_replica


def _cluster_tasks():
    """The number of worker tasks `TF_CONFIG` names (0 when unset or malformed)."""
    import json

    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "") or "{}").get("cluster", {})
    except (ValueError, AttributeError):
        return 0
    return sum(len(cluster.get(kind, [])) for kind in ("chief", "worker"))


def make_strategy():
    """MultiWorkerMirroredStrategy when `TF_CONFIG` names several workers (create it
    before any other TensorFlow op); MirroredStrategy over all visible GPUs; else the
    default strategy on one device."""
    if _cluster_tasks() > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([gpu.name for gpu in gpus])
    return tf.distribute.get_strategy()


def is_chief(strategy) -> bool:
    """The task that writes the run directory: the only one, or the multi-worker chief."""
    if not is_multi_worker(strategy):
        return True
    resolver = strategy.cluster_resolver
    return resolver.task_type == "chief" or (
        resolver.task_type == "worker" and resolver.task_id == 0
        and "chief" not in resolver.cluster_spec().as_dict())


def any_worker(strategy, flag: bool) -> bool:
    """`flag` OR-ed over all workers (a collective: every worker must call it at the same point)."""
    if not is_multi_worker(strategy):
        return bool(flag)
    value = strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
        "SUM", tf.constant(1.0 if flag else 0.0)))
    return bool(strategy.experimental_local_results(value)[0].numpy() > 0)


def wait_for_tokenizer(model_dir, timeout_seconds=600):
    """A non-chief worker's tokenizer: the chief's `tokenizer.model` in the shared `model_dir`."""
    from keras_transformer.data import Tokenizer, tokenizer_path

    path = tokenizer_path(model_dir)
    deadline = time.time() + timeout_seconds
    while not path.exists():
        if time.time() > deadline:
            raise run_dir.RunError(
                f"{path} did not appear within {timeout_seconds} s: the chief writes it; give every worker "
                f"the same --model-dir on a shared file system (or copy the chief's tokenizer.model there)")
        time.sleep(1)
    time.sleep(1)  # written atomically by the chief; settle
    return Tokenizer.load(path)


def prepare_tokenizer(model_dir, corpus, vocab_size, seed):
    """Loads `model_dir/tokenizer.model`, or trains it on both sides of the training split."""
    from keras_transformer.data import Tokenizer, tokenizer_path, train_tokenizer

    path = tokenizer_path(model_dir)
    if not path.exists():
        log.info("training a %d-piece SentencePiece vocabulary on %s", vocab_size, corpus.name)
        train_tokenizer(corpus.texts("train"), path.with_suffix(""), vocab_size, seed=seed)
    return Tokenizer.load(path)


def compute_bleu(translator, pairs_ds, limit=None, beam_size=4, batch_size=64):
    """Detokenized sacreBLEU of `translator` on `(source, target)` string pairs.

    Returns the `sacrebleu.BLEUScore`, its signature, and the hypotheses.
    """
    import sacrebleu

    ds = pairs_ds if limit is None else pairs_ds.take(limit)
    hypotheses, references = [], []
    for sources, targets in ds.batch(batch_size):
        hypotheses.extend(translator.translate(sources, beam_size=beam_size))
        references.extend(t.decode("utf-8") for t in targets.numpy())
    bleu = sacrebleu.metrics.BLEU()
    score = bleu.corpus_score(hypotheses, [references])
    return score, str(bleu.get_signature()), hypotheses


def plot_curves(model_dir):
    """Writes `curves.png`: training/validation loss and validation BLEU per checkpoint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = run_dir.read_history(model_dir)
    if not rows:
        return None
    steps = [int(r["step"]) for r in rows]
    fig, (ax_loss, ax_bleu) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("loss", "train loss"), ("val_loss", "validation loss")):
        values = [(s, float(r[key])) for s, r in zip(steps, rows) if r.get(key)]
        if values:
            ax_loss.plot(*zip(*values), marker="o", label=label)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("label-smoothed cross-entropy")
    ax_loss.legend()
    values = [(s, float(r["bleu"])) for s, r in zip(steps, rows) if r.get("bleu")]
    if values:
        ax_bleu.plot(*zip(*values), marker="o", color="tab:green")
    ax_bleu.set_xlabel("step")
    ax_bleu.set_ylabel("validation BLEU (greedy, subset)")
    fig.suptitle(str(model_dir))
    fig.tight_layout()
    out = pathlib.Path(model_dir) / run_dir.CURVE_FILE
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def weights_are_finite(model) -> bool:
    return all(np.isfinite(w).all() for w in model.get_weights())


@keras.saving.register_keras_serializable(package="keras_transformer")
class TargetTokens(keras.metrics.Metric):
    """Real (non-padding) target tokens seen since the metric was reset: the
    progress display turns it into tokens per second."""

    def __init__(self, name="target_tokens", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(keras.ops.sum(keras.ops.cast(keras.ops.not_equal(y_true, PAD_ID), "float32")))

    def result(self):
        return self.total


# -- callbacks -----------------------------------------------------------------

class _Interrupted(Exception):
    """Raised inside `fit` after a step when a stop signal arrived."""


# Seconds a stop request may wait for the current step to end before the process exits
# without a new checkpoint (a stalled input pipeline, a hung collective): resuming then
# starts from the newest complete checkpoint.
STOP_GRACE_SECONDS = 60.0
# ...and a second stop signal, for the main thread to raise KeyboardInterrupt itself.
SECOND_SIGNAL_SECONDS = 2.0


class StopSignals:
    """Turns SIGTERM and the first Ctrl-C into a request to stop after the
    current step, with a checkpoint.

    Python runs a signal handler only between bytecodes of the main thread, and
    a main thread blocked inside TensorFlow (an input pipeline that never yields
    a batch) may never get there. A watcher thread therefore reads the signals
    from `signal.set_wakeup_fd`, which the interpreter writes at once, and exits
    the process (status 128 + the signal) when the main thread has not left the
    `with` block `grace_seconds` after the first SIGTERM/Ctrl-C, or 2 s after a
    second one (which otherwise raises KeyboardInterrupt in the main thread).

    Args:
        grace_seconds: how long the first signal waits for the step to end.
        exit: what ends the process (`os._exit`; a test passes its own).
    """

    def __init__(self, grace_seconds: float = STOP_GRACE_SECONDS, exit=os._exit):
        self.received = None
        self.grace_seconds = grace_seconds
        self._exit = exit
        self._previous = {}
        self._pipe = None
        self._previous_wakeup_fd = -1
        self._watcher = None

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        if self._previous:
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)
            self._pipe = (read_fd, write_fd)
            self._previous_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
            self._watcher = threading.Thread(target=self._watch, name="stop-signals", daemon=True)
            self._watcher.start()
        return self

    def _handle(self, signum, frame):
        if self.received is not None:  # a second SIGTERM/Ctrl-C quits at once
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name
        print(f"\n{self.received} received: stopping after the current step and writing a checkpoint "
              f"(Ctrl-C again to quit at once)", file=sys.stderr, flush=True)

    def _watch(self):
        read_fd = self._pipe[0]
        signals, deadline = [], None
        while True:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([read_fd], [], [], timeout)
            if not ready:  # the main thread did not get there in time: it is stuck
                reason = (f"no training step ended within {self.grace_seconds:g} s of {signals[0].name}"
                          if len(signals) == 1 else f"a second stop signal ({signals[1].name})")
                self._quit(signals[-1], reason)
                return
            data = os.read(read_fd, 64)
            if not data or 0 in data:  # closed, or __exit__'s stop byte: the run ended by itself
                return
            for signum in data:
                if signum in (signal.SIGTERM, signal.SIGINT):
                    signals.append(signal.Signals(signum))
                    # The main thread normally acts first (a checkpoint; or KeyboardInterrupt
                    # on the second signal), leaving the `with` block, which stops this watcher.
                    wait = self.grace_seconds if len(signals) == 1 else SECOND_SIGNAL_SECONDS
                    deadline = min(deadline or math.inf, time.monotonic() + wait)

    def _quit(self, signum, reason):
        print(f"\n{reason}: exiting now without a new checkpoint. Run the same command again to resume "
              f"from the newest complete checkpoint.", file=sys.stderr, flush=True)
        self._exit(128 + int(signum))

    def __exit__(self, *exc):
        if self._pipe:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            os.write(self._pipe[1], b"\0")
            self._watcher.join(timeout=5)
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


class StepGuard(keras.callbacks.Callback):
    """After every step: stop on a signal (`_Interrupted`) or on a NaN or
    infinite loss (`NonFiniteLossError`), before any checkpoint is written.

    With several workers (`strategy` multi-worker) a signal is acted on only at
    a round's end, after its checkpoint, and by all workers together (a worker
    leaving alone would leave the others waiting in a collective); the loss is
    the same on every worker, so all stop together on a NaN."""

    def __init__(self, signals: StopSignals, strategy=None):
        super().__init__()
        self.signals = signals
        self.multi_worker = strategy is not None and is_multi_worker(strategy)
        self.strategy = strategy

    def on_train_batch_end(self, batch, logs=None):
        loss = float((logs or {}).get("loss", 0.0))
        if not math.isfinite(loss):
            step = int(self.model.optimizer.iterations.numpy())
            raise NonFiniteLossError(f"the training loss became {loss} at step {step}")
        # The last step of a round goes on to its own checkpoint (and history
        # row); the stop then comes at the next round's start.
        last_of_round = batch + 1 >= (self.params or {}).get("steps", 0)
        if self.signals.received and not last_of_round and not self.multi_worker:
            raise _Interrupted(self.signals.received)

    def on_epoch_begin(self, epoch, logs=None):
        if self.multi_worker:
            if any_worker(self.strategy, bool(self.signals.received)):
                raise _Interrupted(self.signals.received or "a stop signal on another worker")
        elif self.signals.received:
            raise _Interrupted(self.signals.received)


class Progress(keras.callbacks.Callback):
    """Step, loss, target tokens/s and ETA: a live line on a terminal, and
    (from `CheckpointAndBleu`) one line per checkpoint otherwise."""

    def __init__(self, total_steps, live=None, stream=None):
        super().__init__()
        self.total_steps = total_steps
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._last = None
        self.tokens_per_second = None
        self._rate_tokens = 0.0
        self._rate_seconds = 0.0

    def on_train_begin(self, logs=None):
        self._last = None
        self._start_step = int(self.model.optimizer.iterations.numpy())
        self._start_time = time.perf_counter()

    def on_epoch_begin(self, epoch, logs=None):
        self._tokens = 0.0
        self._last = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        now = time.perf_counter()
        tokens = float(logs.get("target_tokens", 0.0))
        if self._last is not None and batch > 0:  # the first step of a round includes tracing
            self._rate_tokens += tokens - self._tokens
            self._rate_seconds += now - self._last
            self.tokens_per_second = self._rate_tokens / max(self._rate_seconds, 1e-9)
        self._tokens, self._last = tokens, now
        if self.live:
            print("\r" + self.line(float(logs.get("loss", float("nan")))) + "\033[K", end="",
                  file=self.stream, flush=True)

    def eta_seconds(self):
        step = int(self.model.optimizer.iterations.numpy())
        done = step - self._start_step
        if done <= 0:
            return None
        return (self.total_steps - step) * (time.perf_counter() - self._start_time) / done

    def line(self, loss):
        step = int(self.model.optimizer.iterations.numpy())
        width = 24
        filled = int(width * step / max(self.total_steps, 1))
        parts = [f"step {step}/{self.total_steps} [{'=' * filled}{' ' * (width - filled)}]",
                 f"loss {loss:.4f}"]
        if self.tokens_per_second:
            parts.append(f"{self.tokens_per_second:,.0f} tok/s")
        eta = self.eta_seconds()
        if eta is not None:
            parts.append(f"ETA {_clock(eta)}")
        return "  ".join(parts)

    def end_live_line(self):
        if self.live:
            print(file=self.stream, flush=True)


def _clock(seconds):
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class CheckpointAndBleu(keras.callbacks.Callback):
    """At the end of every round of steps: checkpoint, greedy BLEU on a
    validation subset, one row of `history.csv` (for the curves) and one
    line of console output. Never checkpoints non-finite weights."""

    def __init__(self, store, translator, valid_pairs, bleu_sentences, model_dir, progress=None,
                 started=None, chief=True):
        super().__init__()
        self.started = started
        self.chief = chief
        self.store = store
        self.translator = translator
        self.valid_pairs = valid_pairs
        self.bleu_sentences = bleu_sentences
        self.model_dir = pathlib.Path(model_dir)
        self.progress = progress

    def on_epoch_end(self, epoch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if not weights_are_finite(self.model):
            raise NonFiniteLossError(f"the weights hold NaN or infinite values at step {step}")
        path = self.store.save(step)
        if not self.chief:  # a multi-worker non-chief saves (every worker must) to its own directory, silently
            return
        row = {"step": step}
        for key in ("loss", "val_loss", "accuracy", "val_accuracy"):
            if logs and key in logs:
                row[key] = f"{float(logs[key]):.4f}"
        if self.valid_pairs is not None and self.bleu_sentences:
            score, _, _ = compute_bleu(self.translator, self.valid_pairs,
                                       limit=self.bleu_sentences, beam_size=1)
            row["bleu"] = f"{score.score:.2f}"
        if self.started is not None:
            row["minutes"] = f"{(time.time() - self.started) / 60:.2f}"
        run_dir.append_history(self.model_dir, row)
        parts = [f"step {step}" + (f"/{self.progress.total_steps}" if self.progress else "")]
        for key in ("loss", "val_loss"):
            if key in row:
                parts.append(f"{key} {row[key]}")
        if self.progress and self.progress.tokens_per_second:
            parts.append(f"{self.progress.tokens_per_second:,.0f} tok/s")
        parts.append(f"checkpoint {os.path.basename(path)}")
        if "bleu" in row:
            parts.append(f"greedy BLEU on {self.bleu_sentences} valid sentences {row['bleu']}")
        eta = self.progress.eta_seconds() if self.progress else None
        if eta is not None and step < self.progress.total_steps:
            parts.append(f"ETA {_clock(eta)}")
        if self.progress:
            self.progress.end_live_line()
        print(", ".join(parts), flush=True)


class TimeBudget(keras.callbacks.Callback):
    """Stops `fit` at the end of a round (after the callbacks before it wrote the
    round's checkpoint) when the next round, as long as this one took, would end
    more than `seconds` after `started`."""

    def __init__(self, seconds, started, strategy=None):
        super().__init__()
        self.seconds = seconds
        self.started = started
        self.strategy = strategy
        self.exhausted = False
        self._round_started = None

    def on_epoch_begin(self, epoch, logs=None):
        self._round_started = time.time()

    def on_epoch_end(self, epoch, logs=None):
        now = time.time()
        round_seconds = now - (self._round_started or now)
        over = now - self.started + round_seconds > self.seconds
        if self.strategy is not None:  # several workers stop together or not at all
            over = any_worker(self.strategy, over)
        if over:
            self.exhausted = True
            self.model.stop_training = True
            step = int(self.model.optimizer.iterations.numpy())
            print(f"time budget: {self.seconds / 60:g} min; stopping at step {step}, after "
                  f"{(now - self.started) / 60:.1f} min (the next round would end past the budget)",
                  flush=True)


# -- the run -----------------------------------------------------------------------

# `mixed_float16`'s first loss scale (Keras's default); halved at every overflowing step.
INITIAL_LOSS_SCALE = 2.0 ** 15


def mixed_precision_policy() -> str:
    """`--mixed-precision`'s policy: mixed_float16 (with loss scaling) on GPUs,
    mixed_bfloat16 (no scaling needed) on CPU."""
    return "mixed_float16" if tf.config.list_logical_devices("GPU") else "mixed_bfloat16"


def _fit_rounds(model, train_ds, valid_ds, callbacks, start_step, steps, every, stopped=lambda: False):
    """Runs `fit` from `start_step` to `steps` in rounds ending at multiples of
    `every` (and at `steps`), so checkpoints fall on the same steps whether or
    not the run was interrupted in between. `stopped()` true after a part:
    the time budget ran out, no further part runs."""
    step = start_step
    offset = step % every
    if offset and step < steps:
        # Resumed mid-round (after a signal): finish that round first; the
        # rest then reads on from where this part's batches end.
        first = min(every - offset, steps - step)
        model.fit(train_ds, epochs=1, steps_per_epoch=first, validation_data=valid_ds,
                  callbacks=callbacks, verbose=0, shuffle=False)
        train_ds = train_ds.skip(first)
        step += first
    if step >= steps or stopped():
        return
    full_rounds, last = divmod(steps - step, every)
    if full_rounds:
        model.fit(train_ds, epochs=step // every + full_rounds, initial_epoch=step // every,
                  steps_per_epoch=every, validation_data=valid_ds, callbacks=callbacks, verbose=0,
                  shuffle=False)  # the dataset shuffles itself
        train_ds = train_ds.skip(full_rounds * every)
    if last and not stopped():
        model.fit(train_ds, epochs=1, steps_per_epoch=last, validation_data=valid_ds,
                  callbacks=callbacks, verbose=0, shuffle=False)


def averaged_checkpoints(store, every, steps, count):
    """The last `count` checkpoints on round boundaries (multiples of `every`,
    or the final step): a checkpoint written at a signal is not averaged."""
    on_rounds = [path for path in store.paths
                 if (lambda s: s % every == 0 or s == steps)(int(path.rsplit("-", 1)[1]))]
    return on_rounds[-count:]


def train_and_evaluate(run: TrainingConfig) -> TrainedRun:
    """Runs the whole job for `run`; returns the averaged model and its figures.

    Raises `RunError`, `CorpusError`, `TokenizerError`, `CheckpointError`
    or `NonFiniteLossError` with a one-line message.
    """
    from keras_transformer import LabelSmoothedCrossEntropy, MaskedAccuracy, build_transformer, make_optimizer
    from keras_transformer.checkpoints import CheckpointStore, average_checkpoints
    from keras_transformer.data import count_overlong, load_corpus, make_batches
    from keras_transformer.model import source_feature_names
    from keras_transformer.schedule import CountingLossScaleOptimizer
    from keras_transformer.translator import Translator

    started = time.time()
    # Several workers (TF_CONFIG): the collective strategy must exist before any other op.
    strategy = make_strategy() if _cluster_tasks() > 1 else None
    chief = strategy is None or is_chief(strategy)
    model_dir = pathlib.Path(run.model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(run.seed)
    if run.mixed_precision:
        keras.mixed_precision.set_global_policy(mixed_precision_policy())

    corpus = load_corpus(run.data, run.source_lang, run.target_lang, seed=run.seed)
    log.info("data %s (%s -> %s): %s", corpus.name, corpus.source_lang, corpus.target_lang,
             dict(corpus.sizes))
    tokenizer = (prepare_tokenizer(model_dir, corpus, run.vocab_size, run.seed) if chief
                 else wait_for_tokenizer(model_dir))
    config = run.model_config(tokenizer.vocab_size)
    data_args = {"data": corpus.name, "source_lang": corpus.source_lang, "target_lang": corpus.target_lang}
    if chief:
        run_dir.check_run_file(model_dir, config, tokenizer, data_args, fingerprint=corpus.fingerprint(),
                               allow_data_change=run.allow_data_change)
    log.info("config %s: %s", run.preset, config)
    overlong = count_overlong(corpus.splits["train"], tokenizer, config.max_length)
    log.info("training split: %s", overlong)
    if overlong.either >= overlong.pairs and not config.syntax_aware:  # syntax-aware sources are truncated
        where = " / ".join((corpus.files or {}).get("train", ())) or corpus.name
        raise run_dir.RunError(f"{where}: all {overlong.pairs} training pairs are longer than max_length="
                               f"{config.max_length} tokens (source {overlong.source}, target "
                               f"{overlong.target}), so no batch could ever be made; raise --max-length")

    strategy = strategy or make_strategy()
    multi_worker = is_multi_worker(strategy)
    replicas = strategy.num_replicas_in_sync
    # A syntax-aware model reads CoNLL-U sources (pairs, batches, BLEU alike).
    pairs = corpus.annotated if config.syntax_aware else corpus.dataset
    syntax = dict(source_features=source_feature_names(config), tag_factors=config.source_tags)
    try:
        train_ds = make_batches(pairs("train"), tokenizer, batch_tokens=run.batch_tokens,
                                max_length=config.max_length, shuffle=True, seed=run.seed, repeat=True,
                                batch_multiple=replicas, **syntax)
    except ValueError as error:  # e.g. the budget cannot give every replica a longest pair
        raise run_dir.RunError(f"--batch-tokens {run.batch_tokens} with {replicas} replica(s): {error}") from None
    valid_split = "valid" if "valid" in corpus.splits else None
    valid_ds = None
    if valid_split:
        valid_ds = make_batches(pairs(valid_split), tokenizer, batch_tokens=run.batch_tokens,
                                max_length=config.max_length, batch_multiple=replicas, **syntax).cache()

    with strategy.scope():
        model = build_transformer(config)
        optimizer = make_optimizer(config)
        if keras.mixed_precision.global_policy().name == "mixed_float16":  # loss scaling, skips counted
            optimizer = CountingLossScaleOptimizer(optimizer, initial_scale=INITIAL_LOSS_SCALE)
        model.compile(optimizer=optimizer,
                      loss=LabelSmoothedCrossEntropy(config.label_smoothing),
                      metrics=[MaskedAccuracy(), TargetTokens()], jit_compile=run.jit_compile)
        model.optimizer.build(model.trainable_variables)
    enable_multi_worker_fit(model, strategy)
    chief_checkpoints = model_dir / run_dir.CHECKPOINT_DIR
    if chief:
        store = CheckpointStore(chief_checkpoints, model, model.optimizer, tokenizer.sha256,
                                max_to_keep=run.keep_checkpoints + 1)
        start_step = store.restore_latest()
    else:
        # Every worker saves (TensorFlow's rule for multi-worker checkpoints), a
        # non-chief into its own directory, removed at the end; all resume from
        # the chief's checkpoints.
        worker_dir = model_dir / f".worker-{strategy.cluster_resolver.task_id}"
        store = CheckpointStore(worker_dir / run_dir.CHECKPOINT_DIR, model, model.optimizer, tokenizer.sha256,
                                max_to_keep=1)
        start_step = CheckpointStore(chief_checkpoints, model, model.optimizer, tokenizer.sha256).restore_latest()
    every = run.checkpoint_every
    log.info("%d replica(s); %d steps in rounds of %d; resuming at step %d",
             replicas, run.steps, every, start_step)

    translator = Translator(model, config, tokenizer.model_bytes)
    progress = Progress(run.steps)
    signals = StopSignals()
    if chief:
        callbacks = [
            StepGuard(signals, strategy),
            progress,
            CheckpointAndBleu(store, translator, pairs(valid_split) if valid_split else None,
                              run.bleu_every_sentences, model_dir, progress, started),
            keras.callbacks.TensorBoard(log_dir=str(model_dir / run_dir.LOG_DIR), update_freq=max(1, every // 4)),
        ]
    else:
        callbacks = [StepGuard(signals, strategy), CheckpointAndBleu(store, None, None, 0, model_dir, chief=False)]
    budget = (TimeBudget(run.max_minutes * 60, started, strategy if multi_worker else None)
              if run.max_minutes else None)
    if budget:
        callbacks.append(budget)  # last: after the round's checkpoint
    with signals:
        try:
            _fit_rounds(model, train_ds, valid_ds, callbacks, start_step, run.steps, every,
                        stopped=lambda: bool(budget and budget.exhausted))
            if any_worker(strategy, bool(signals.received)):  # arrived during the last round's checkpoint
                raise _Interrupted(signals.received or "a stop signal on another worker")
        except _Interrupted:
            progress.end_live_line()
            step = int(model.optimizer.iterations.numpy())
            newest = store.paths[-1] if store.paths else ""
            path = newest if newest.endswith(f"-{step}") else store.save(step)
            print(f"stopped at step {step} of {run.steps} ({signals.received}); checkpoint "
                  f"{os.path.basename(path)} written. Run the same command again to resume.", flush=True)
            return TrainedRun(model, config, tokenizer, {"steps": step, "interrupted": signals.received},
                              model_dir, interrupted=True)
        except NonFiniteLossError as error:
            progress.end_live_line()
            newest = store.paths[-1] if store.paths else None
            kept = (f"the newest checkpoint is still {os.path.basename(newest)} (finite weights)" if newest
                    else "no checkpoint was written")
            raise NonFiniteLossError(f"{error}; training stopped and {kept}. Lower the learning rate "
                                     f"(--config's warmup_steps) or check the data, then rerun to "
                                     f"resume from the last checkpoint") from None

    if not chief:  # the chief averages, evaluates and exports
        import shutil

        step = int(model.optimizer.iterations.numpy())
        shutil.rmtree(worker_dir, ignore_errors=True)
        print(f"worker {strategy.cluster_resolver.task_id}: trained to step {step}; the chief averages, "
              f"evaluates and exports", flush=True)
        return TrainedRun(model, config, tokenizer, {"steps": step}, model_dir, chief=False)

    averaged = averaged_checkpoints(store, every, run.steps, run.average)
    log.info("averaging %d checkpoint(s): %s", len(averaged), ", ".join(os.path.basename(p) for p in averaged))
    average_checkpoints(model, averaged)
    model.save_weights(model_dir / run_dir.FINAL_WEIGHTS)

    results = {"steps": int(model.optimizer.iterations.numpy()), "averaged_checkpoints": len(averaged),
               "train_minutes": round((time.time() - started) / 60, 2)}
    if hasattr(model.optimizer, "skipped_steps"):  # mixed_float16: steps skipped by loss scaling
        results["skipped_steps"] = int(model.optimizer.skipped_steps.numpy())
    if budget and budget.exhausted:
        results["stopped_by_time_budget"] = run.max_minutes
    # Every test set of the data is scored: `test` when there is one, each by its own
    # name (test2016, test2017, ...) when a directory holds several.
    for split in ["valid"] * ("valid" in corpus.splits) + sorted(s for s in corpus.splits if s.startswith("test")):
        score, signature, hyps = compute_bleu(translator, pairs(split), beam_size=run.beam_size)
        results[f"{split}_bleu"] = round(score.score, 2)
        results["bleu_signature"] = signature
        run_dir.hypothesis_path(model_dir, split).write_text("\n".join(hyps) + "\n", encoding="utf-8")
        print(f"{split} BLEU (beam {run.beam_size}, averaged model) = {score.score:.2f}  [{signature}]",
              flush=True)
    plot_curves(model_dir)
    results["seconds"] = round(time.time() - started, 1)
    run_dir.write_results(model_dir, results)
    return TrainedRun(model, config, tokenizer, results, model_dir)
