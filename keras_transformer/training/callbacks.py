"""The callbacks of a training run's `fit`: stop on a signal or a non-finite loss,
the progress line, a checkpoint with a greedy BLEU and a history row at the end of
every round, early stopping and the time budget."""

from __future__ import annotations

import math
import os
import pathlib
import sys
import time

import keras
import numpy as np

from keras_transformer import run_dir
from keras_transformer.training.distribute import any_worker, is_multi_worker
from keras_transformer.training.evaluation import compute_bleu
from keras_transformer.training.stop_signals import Interrupted, StopSignals


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite (one-line message)."""


def weights_are_finite(model) -> bool:
    return all(np.isfinite(w).all() for w in model.get_weights())


class StepGuard(keras.callbacks.Callback):
    """After every step: stop on a signal (`Interrupted`) or on a NaN or
    infinite loss (`NonFiniteLossError`), before any checkpoint is written.

    With several workers (`strategy` multi-worker) a signal is acted on only at
    a round's end, after its checkpoint, and by all workers together (a worker
    leaving alone would leave the others waiting in a collective); the loss is
    the same on every worker, so all stop together on a NaN.

    With `accumulate` batches an update (gradient accumulation; rounds then start on an
    update's first batch) a signal waits for the update's last batch, so that the
    checkpoint it writes holds no half-accumulated gradients."""

    def __init__(self, signals: StopSignals, strategy=None, accumulate: int = 1):
        super().__init__()
        self.signals = signals
        self.multi_worker = strategy is not None and is_multi_worker(strategy)
        self.strategy = strategy
        self.accumulate = accumulate

    def on_train_batch_end(self, batch, logs=None):
        loss = float((logs or {}).get("loss", 0.0))
        if not math.isfinite(loss):
            step = int(self.model.optimizer.iterations.numpy())
            raise NonFiniteLossError(f"the training loss became {loss} at step {step}")
        # The last step of a round goes on to its own checkpoint (and history
        # row); the stop then comes at the next round's start.
        last_of_round = batch + 1 >= (self.params or {}).get("steps", 0)
        mid_update = (batch + 1) % self.accumulate != 0
        if self.signals.received and not last_of_round and not mid_update and not self.multi_worker:
            raise Interrupted(self.signals.received)

    def on_epoch_begin(self, epoch, logs=None):
        if self.multi_worker:
            if any_worker(self.strategy, bool(self.signals.received)):
                raise Interrupted(self.signals.received or "a stop signal on another worker")
        elif self.signals.received:
            raise Interrupted(self.signals.received)


class Progress(keras.callbacks.Callback):
    """Step, loss, target tokens/s (of the current round) and ETA: a live line on a
    terminal, and (from `CheckpointAndBleu`) one line per checkpoint otherwise."""

    def __init__(self, total_steps, live=None, stream=None, budget_seconds=None, started=None):
        """`budget_seconds` from `started` (`time.time()`): the run's time budget
        (`--max-minutes`), which ends training before `total_steps` when it comes first
        (the Multi30k preset's 56 minutes reach ~5,500-10,750 of its 40,000 steps), so the
        ETA is the sooner of the two: the budget's is when it runs out (`TimeBudget` stops
        at the last round that ends before it, up to a round sooner)."""
        super().__init__()
        self.total_steps = total_steps
        self.budget_seconds = budget_seconds
        self.started = started
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
        # tok/s is the current round's (its first step aside): a pause of the process (Ctrl-Z,
        # a suspended laptop, SIGSTOP) slowed only its own round's figure, where a run-long
        # average read 483 tok/s after a 10-minute stop and stayed low for the rest of the run.
        self._tokens = 0.0
        self._rate_tokens = self._rate_seconds = 0.0
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
        eta = (self.total_steps - step) * (time.perf_counter() - self._start_time) / done
        if self.budget_seconds:
            eta = min(eta, max(0.0, self.started + self.budget_seconds - time.time()))
        return eta

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
                 started=None, chief=True, minutes_before=0.0):
        """`minutes` of a row: `minutes_before` (a resumed run's earlier parts) plus this
        process's since `started` (`time.time()`)."""
        super().__init__()
        self.started = started
        self.minutes_before = minutes_before
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
            score, _, hypotheses = compute_bleu(self.translator, self.valid_pairs,
                                                limit=self.bleu_sentences, beam_size=1)
            row["bleu"] = f"{score.score:.2f}"
            scored = len(hypotheses)  # fewer than bleu_sentences when the valid split is smaller
        if self.started is not None:
            row["minutes"] = f"{self.minutes_before + (time.time() - self.started) / 60:.2f}"
        run_dir.append_history(self.model_dir, row)
        parts = [f"step {step}" + (f"/{self.progress.total_steps}" if self.progress else "")]
        for key in ("loss", "val_loss"):
            if key in row:
                parts.append(f"{key} {row[key]}")
        if self.progress and self.progress.tokens_per_second:
            parts.append(f"{self.progress.tokens_per_second:,.0f} tok/s")
        parts.append(f"checkpoint {os.path.basename(path)}")
        if "bleu" in row:
            parts.append(f"greedy BLEU on {scored} valid sentences {row['bleu']}")
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
        self.projected_step = None
        self._round_started = None
        self._round_first_step = 0
        self._rounds = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._round_started = time.time()
        self._round_first_step = int(self.model.optimizer.iterations.numpy())

    def on_epoch_end(self, epoch, logs=None):
        now = time.time()
        round_seconds = now - (self._round_started or now)
        over = now - self.started + round_seconds > self.seconds
        if self.strategy is not None:  # several workers stop together or not at all
            over = any_worker(self.strategy, over)
        self._rounds += 1
        if self._rounds == 2 and not over and round_seconds > 0:
            self._project(now, round_seconds)
        if over:
            self.exhausted = True
            self.model.stop_training = True
            step = int(self.model.optimizer.iterations.numpy())
            print(f"time budget: {self.seconds / 60:g} min; stopping at step {step}, after "
                  f"{(now - self.started) / 60:.1f} min (the next round would end past the budget)",
                  flush=True)

    def _project(self, now, round_seconds):
        """After this process's second round (its first one traces): the step the budget
        will reach at this round's pace. A wall-clock recipe trains a different model on a
        slower machine (the Multi30k preset's 56 minutes: ~10,500 steps on the machine of
        its figures, ~1,750 on an AVX2-only 2-core VM), so the log says which."""
        step = int(self.model.optimizer.iterations.numpy())
        steps = step - self._round_first_step
        rounds_left = int((self.seconds - (now - self.started)) // round_seconds)
        self.projected_step = step + rounds_left * steps
        print(f"time budget: {round_seconds / 60:.2f} min per round of {steps} steps, so the "
              f"{self.seconds / 60:g} min budget reaches about step {self.projected_step:,} (a recipe "
              f"measured on a faster machine made more: `--steps N --max-minutes 0` trains N steps "
              f"whatever the time)", flush=True)


def rounds_without_improvement(rows, up_to_step=None) -> tuple[int, int | None]:
    """`(rounds, best_step)` of `history.csv`'s rows (`run_dir.read_history`): the rounds
    since the lowest validation loss (as written, to 4 decimals; a tie is no improvement),
    and that round's step (None, with 0 rounds, without a validation loss). Rows past
    `up_to_step` (a run resumed from an older checkpoint) are left out, and of two rows of
    one step the later counts."""
    losses = {}
    for row in rows:
        step = int(row["step"])
        if (up_to_step is None or step <= up_to_step) and row.get("val_loss"):
            losses[step] = float(row["val_loss"])
    best_step, best = None, math.inf
    for step in sorted(losses):
        if losses[step] < best:
            best_step, best = step, losses[step]
    return (0, None) if best_step is None else (sum(1 for step in losses if step > best_step), best_step)


class EarlyStopping(keras.callbacks.Callback):
    """Stops `fit` at the end of a round (after the callbacks before it wrote the round's
    checkpoint and history row) once the validation loss has not improved for `patience`
    rounds. It counts from `history.csv`, so a resumed run goes on counting where the part
    before it stopped (Keras's own `EarlyStopping` keeps its count in memory), and several
    workers stop together, on the chief's count (the others write no history)."""

    def __init__(self, patience, model_dir, strategy=None, chief=True):
        super().__init__()
        self.patience = patience
        self.model_dir = pathlib.Path(model_dir)
        self.strategy = strategy
        self.chief = chief
        self.stopped = False
        self.best_step = None

    def on_epoch_end(self, epoch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())  # (rows past it: a part resumed from an older checkpoint)
        rounds, self.best_step = (rounds_without_improvement(run_dir.read_history(self.model_dir), up_to_step=step)
                                  if self.chief else (0, None))
        over = rounds >= self.patience
        if self.strategy is not None:  # several workers stop together or not at all
            over = any_worker(self.strategy, over)
        if over:
            self.stopped = True
            self.model.stop_training = True
            if self.chief:
                print(f"early stopping: the validation loss has not improved for {rounds} checkpoints (best at "
                      f"step {self.best_step}); stopping at step {step}", flush=True)
