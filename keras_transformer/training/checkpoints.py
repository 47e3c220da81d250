"""Checkpoints: save every N steps, resume from the newest complete one,
average the last K into the final weights (paper section 6.1).

TensorFlow's object-based checkpoints hold the model weights, the optimizer
state (Adam moments and the iteration counter that drives the schedule) and
the SHA-256 of the tokenizer the run was trained with. A checkpoint becomes
visible only when `tf.train.CheckpointManager` rewrites its `checkpoint`
state file, after the data and index files are complete, so a process
killed mid-save leaves the previous checkpoint as the newest one.
"""

from __future__ import annotations

import logging
import os
import re
import shutil

import numpy as np
import tensorflow as tf

from keras_transformer.atomic_writes import write_failure

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used (missing, corrupt, other tokenizer)."""


class CheckpointStore:
    """The checkpoints of one run in `directory`.

    Args:
        directory: where `ckpt-<step>.*` files and the `checkpoint` state go.
        model: the Keras model.
        optimizer: its optimizer, built (`optimizer.build(model.trainable_variables)`)
            so that restoring fills its slots.
        tokenizer_sha256: hash of the run's tokenizer model file.
        max_to_keep: how many recent checkpoints stay on disk.
    """

    def __init__(self, directory, model, optimizer, tokenizer_sha256, max_to_keep=5):
        self.directory = os.fspath(directory)
        self.model = model
        self.optimizer = optimizer
        self.tokenizer_sha256 = tokenizer_sha256
        self._stored_sha256 = tf.Variable(tokenizer_sha256, dtype=tf.string, trainable=False)
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                              tokenizer_sha256=self._stored_sha256)
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.directory,
                                                  max_to_keep=max_to_keep)

    @property
    def paths(self) -> list[str]:
        """Complete checkpoints kept on disk, oldest first."""
        return list(self.manager.checkpoints)

    def save(self, step: int) -> str:
        """Writes `ckpt-<step>`; returns its path. Raises `CheckpointError` in one line
        when it cannot be written (a full disk, no permission): the checkpoints
        written before stay complete (TensorFlow writes the data, then the index,
        then the `checkpoint` state file that names the newest). What the failed
        save had written (``ckpt-<step>_temp/``, ``ckpt-<step>.*``: up to a whole
        checkpoint's size, on the disk that is full) is removed."""
        self._stored_sha256.assign(self.tokenizer_sha256)
        before = set(os.listdir(self.directory)) if os.path.isdir(self.directory) else set()
        try:
            return self.manager.save(checkpoint_number=step)
        except (OSError, tf.errors.OpError) as error:
            self._remove_partial(f"ckpt-{step}", before)
            newest = os.path.basename(self.paths[-1]) if self.paths else None
            raise CheckpointError(
                f"cannot write checkpoint ckpt-{step} in {self.directory}: {write_failure(error)}; "
                + (f"the newest complete checkpoint is still {newest}" if newest else "no checkpoint was written")
                + ". Free space (or fix the permissions) and rerun the same command to resume") from None

    def _remove_partial(self, prefix: str, before: set[str]) -> None:
        """Removes the files of checkpoint `prefix` that a failed save made (not in `before`)."""
        if not os.path.isdir(self.directory):
            return
        for name in set(os.listdir(self.directory)) - before:
            if name == f"{prefix}_temp" or name.startswith(f"{prefix}."):
                _remove_partial_file(os.path.join(self.directory, name))

    def remove_unfinished_saves(self) -> list[str]:
        """Removes what a save that never finished (SIGKILL, a lost machine) left in the
        directory; returns the names removed. TensorFlow writes ``ckpt-<N>_temp/``, merges it
        into ``ckpt-<N>.index`` and ``ckpt-<N>.data-*``, then names the checkpoint in the
        ``checkpoint`` state file: a kill in between leaves the temporary directory, or the
        files of a checkpoint that nothing lists, newer than the newest listed (a SIGTERM's
        checkpoint cut off by the SIGKILL that follows a scheduler's grace period: 11 MB for
        `tiny` at 200 pieces, killed by hand; `base`'s 63.1M parameters and Adam's two moments make ~757
        MB, never read, never overwritten, since its step is not a round's). Resuming takes the
        newest listed checkpoint either way. Only the run's chief calls it (it holds the
        directory's lock); files of checkpoints older than the newest listed are left alone (a
        lost state file is not a reason to delete checkpoints)."""
        if not os.path.isdir(self.directory):
            return []
        listed = {os.path.basename(path) for path in self.paths}
        newest = max((int(name.split("-")[1]) for name in listed), default=None)
        removed = []
        for name in sorted(os.listdir(self.directory)):
            match = re.fullmatch(r"ckpt-(\d+)(_temp|\.index|\.data-\d+-of-\d+)", name)
            if not match or f"ckpt-{match.group(1)}" in listed:
                continue
            if match.group(2) == "_temp" or (newest is not None and int(match.group(1)) > newest):
                if _remove_partial_file(os.path.join(self.directory, name)):  # else left, as before: nothing reads it
                    removed.append(name)
        if removed:
            log.warning("removed %s: left by a checkpoint save that did not finish (the process was killed)",
                        ", ".join(removed))
        return removed

    def restore_latest(self) -> int:
        """Restores the newest readable checkpoint; returns its step (0 if none).

        A checkpoint that cannot be read (deleted or truncated files) is
        skipped with a warning in favour of the one before it. A checkpoint
        written with a different tokenizer raises `CheckpointError`, and so do
        checkpoints none of which can be restored: the run would otherwise start
        again from step 0 and, keeping its newest checkpoints, delete them.
        """
        failures = []
        for path in reversed(self.paths):
            try:  # the index, read once for the two checks below
                reader = tf.train.load_checkpoint(path)
            except tf.errors.OpError:
                reader = None  # unreadable: the restore says so
            check_checkpoint_tokenizer(path, self.tokenizer_sha256, reader)
            other_accumulation = reader is not None and self._accumulation_differs(reader)
            try:
                if other_accumulation:
                    self._restore_other_accumulation(path)
                else:
                    self.checkpoint.restore(path).assert_existing_objects_matched()
            except Exception as error:  # noqa: BLE001 - TF raises OpError, IndexError, ValueError...
                failures.append(f"{os.path.basename(path)}: {str(error).splitlines()[0][:200]}")
                log.warning("checkpoint %s is unreadable (%s); trying the one before",
                            path, str(error).splitlines()[0])
                continue
            inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)
            if other_accumulation or inner.gradient_accumulation_steps:
                # A checkpoint's number is its update count (`save(step)` with `iterations`);
                # the batch counter of this run's accumulation follows from it.
                inner._iterations.assign(checkpoint_step(path) * (inner.gradient_accumulation_steps or 1))
            return int(self.optimizer.iterations.numpy())
        if failures:
            raise CheckpointError(
                f"none of the {len(failures)} checkpoints in {self.directory} can be restored into this model and "
                f"optimizer (newest: {failures[0]}); they are left as they are. If a flag that shapes the optimizer "
                f"changed since the run started (--mixed-precision on a GPU adds loss scaling), rerun with the "
                f"flags it had; if the files are damaged, move the checkpoints away or use a new --model-dir")
        return 0

    def _accumulation_differs(self, reader) -> bool:
        """Whether the checkpoint that `reader` reads (its `tf.train.load_checkpoint`) was
        written with gradient accumulation where this optimizer has none, or the other way
        round: Keras keeps the accumulated gradients among the optimizer's variables, which a
        checkpoint stores by position, so such a checkpoint holds more or fewer of them
        (`--accumulate` changed on resume). A loss-scaling optimizer (`mixed_float16`) is asked
        about the one it wraps."""
        inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        prefix = "optimizer/inner_optimizer/" if inner is not self.optimizer else "optimizer/"
        names = reader.get_variable_to_shape_map()
        saved = sum(1 for name in names if re.match(re.escape(prefix) + r"(_iterations|_variables/\d+)/", name))
        return saved not in (0, len(inner.variables))

    def _restore_other_accumulation(self, path: str) -> None:
        """Restores a checkpoint written with another accumulation (`_accumulation_differs`):
        into a stand-in optimizer of the checkpoint's form, whose Adam moments are then
        copied. The accumulated gradients are not: a checkpoint is written at an update's
        end, when they are zero."""
        inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        steps = inner.gradient_accumulation_steps
        other = {"gradient_accumulation_steps": None if steps else 2}
        config = self.optimizer.get_config()
        if inner is self.optimizer:
            config.update(other)
        else:  # the loss-scaling wrapper's config holds the wrapped optimizer's, serialized
            config["inner_optimizer"] = {**config["inner_optimizer"],
                                         "config": {**config["inner_optimizer"]["config"], **other}}
        stand_in = type(self.optimizer).from_config(config)
        stand_in.build(self.model.trainable_variables)
        # A compiled model tracks its optimizer too: it holds the stand-in while the checkpoint
        # is read, so that every object the restore can reach is one the checkpoint fills.
        compiled_with = getattr(self.model, "optimizer", None)
        if compiled_with is not None:
            self.model.optimizer = stand_in
        try:
            tf.train.Checkpoint(model=self.model, optimizer=stand_in, tokenizer_sha256=self._stored_sha256).restore(
                path).assert_existing_objects_matched()
        finally:
            if compiled_with is not None:
                self.model.optimizer = compiled_with

        def slots(optimizer):  # counters, loss scale, the per-variable state (Adam's moments), in build order
            return [v for v in optimizer.variables if "gradient_accumulator" not in v.path]

        ours, saved = slots(self.optimizer), slots(stand_in)
        if [v.shape for v in ours] != [v.shape for v in saved]:
            raise ValueError(f"its optimizer state does not fit this optimizer's ({len(saved)} against "
                             f"{len(ours)} variables)")
        for variable, value in zip(ours, saved):
            variable.assign(value)
        if steps:
            inner._backend_reset_gradient_accumulators()


def checkpoint_step(path: str) -> int:
    """The step (update) number of checkpoint `path` (`.../ckpt-<step>`)."""
    return int(os.path.basename(path).rsplit("-", 1)[1])


def _remove_partial_file(path: str) -> bool:
    """Removes a file or directory of a checkpoint save that did not finish; a warning, and
    False, when it cannot be removed (the save's own error, or the resume, goes on)."""
    try:
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    except OSError as error:
        log.warning("could not remove the partial checkpoint file %s: %s", path, error)
        return False
    return True


def check_checkpoint_tokenizer(path: str, tokenizer_sha256: str, reader=None) -> None:
    """Raises `CheckpointError` unless checkpoint `path` was trained with this tokenizer.
    `reader`: its `tf.train.load_checkpoint`, where the caller has it open already."""
    try:
        stored = (reader or tf.train.load_checkpoint(path)).get_tensor(
            "tokenizer_sha256/.ATTRIBUTES/VARIABLE_VALUE")
    except tf.errors.OpError:
        return  # unreadable: the caller's restore reports it
    stored = stored.decode() if isinstance(stored, bytes) else str(stored)
    if stored != tokenizer_sha256:
        raise CheckpointError(
            f"checkpoint {path} was trained with a tokenizer of sha256 {stored[:12]}..., "
            f"but the tokenizer given has sha256 {tokenizer_sha256[:12]}...; use the run's own "
            f"tokenizer.model or start a new --model-dir")


def average_checkpoints(model, paths) -> None:
    """Sets `model`'s weights to the element-wise mean of the checkpoints in `paths`.

    Only model weights are averaged (the paper's "averaging the last 5
    checkpoints"); optimizer state is not read. A checkpoint that cannot be
    read (truncated or deleted files) is skipped with a warning naming it, as
    resuming skips it; `CheckpointError` when none can be read.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    checkpoint = tf.train.Checkpoint(model=model)
    total, read, unreadable = None, 0, []
    for path in paths:
        try:
            checkpoint.restore(path).expect_partial()
        except Exception as error:  # noqa: BLE001 - TF raises OpError, IndexError, ValueError...
            unreadable.append(f"{os.path.basename(path)} ({str(error).splitlines()[0][:120]})")
            continue
        weights = [np.asarray(w, dtype=np.float64) for w in model.get_weights()]
        total = weights if total is None else [t + w for t, w in zip(total, weights)]
        read += 1
    if unreadable:  # as resuming does: a checkpoint that cannot be read is skipped, loudly
        log.warning("averaging %d of %d checkpoints: skipped unreadable %s", read, len(paths),
                    "; ".join(unreadable))
    if not read:
        raise CheckpointError(f"none of the {len(paths)} checkpoints to average can be read: "
                              + "; ".join(unreadable))
    model.set_weights([(t / read).astype(w.dtype)
                       for t, w in zip(total, model.get_weights())])
