"""The layout of a model directory: every file name, and the code that reads
and writes the small files (`run.json`, `history.csv`, `results.json`).

    MODEL_DIR/
      tokenizer.model      shared SentencePiece vocabulary (data.tokenizer_path)
      run.json             model config, tokenizer SHA-256, data and its fingerprint, the
                           run it started from (--init-from)
      checkpoints/         ckpt-<step>.* and the `checkpoint` state file
      logs/                TensorBoard
      history.csv          loss / validation loss / BLEU / minutes per checkpoint
      curves.png           the same as a plot
      final.weights.h5     the average of the last K checkpoints
      valid.hyp.txt ...    the final translations per split
      results.json         final figures
      export/<version>/    SavedModel for TF Serving
      .train.lock          flock held while a train.py trains here (ModelDirLock)
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import pathlib
import re
import shutil

from keras_transformer.atomic_writes import write_bytes_atomically, write_failure
from keras_transformer.config import SCHEDULE_ONLY_FIELDS, TransformerConfig
from keras_transformer.console import sigterm_raises

RUN_FILE = "run.json"
HISTORY_FILE = "history.csv"
HISTORY_COLUMNS = ("step", "loss", "val_loss", "accuracy", "val_accuracy", "bleu", "minutes")
CURVE_FILE = "curves.png"
CHECKPOINT_DIR = "checkpoints"
LOG_DIR = "logs"
FINAL_WEIGHTS = "final.weights.h5"
RESULTS_FILE = "results.json"
LOCK_FILE = ".train.lock"
EXPORT_DIR = "export"
HYPOTHESIS_FILE = "{split}.hyp.txt"

log = logging.getLogger(__name__)


class RunError(RuntimeError):
    """A user-facing problem with the run's flags or model directory."""


def hypothesis_path(model_dir, split: str) -> pathlib.Path:
    """Where the final translations of `split` go."""
    return pathlib.Path(model_dir) / HYPOTHESIS_FILE.format(split=split)


def make_model_dir(model_dir) -> pathlib.Path:
    """Creates `model_dir` (and its parents) if needed; `RunError` in one line when it
    cannot be a directory (a file of that name, no permission)."""
    model_dir = pathlib.Path(model_dir)
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        what = "exists and is not a directory" if model_dir.exists() else "cannot be created"
        raise RunError(f"--model-dir {model_dir} {what} ({error.strerror or error}); "
                       f"give a directory train.py can write") from None
    return model_dir


class ModelDirLock:
    """An exclusive `flock` on `MODEL_DIR/.train.lock`, holding this process's pid and start
    time, so that a second `train.py` on the same directory (a job restarted while the first
    still runs) is refused instead of writing checkpoints and history into the same run.
    The kernel drops the lock when the process ends, however it ends (a `kill -9` too), so a
    rerun after a crash resumes as before. Where the file system has no `flock` (some network
    file systems), no lock is held."""

    def __init__(self, model_dir):
        import fcntl
        import time

        self.path = pathlib.Path(model_dir) / LOCK_FILE
        self._file = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise RunError(f"another train.py is training in {model_dir} ({holder}); wait for it to end or "
                           f"stop it (it checkpoints and exits on SIGTERM), or give another --model-dir") from None
        except OSError:  # no flock here (ENOLCK, EOPNOTSUPP): train unlocked, as before
            self._file.close()
            self._file = None
            return
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the file drops the lock
            self._file = None


def read_run_file(model_dir) -> dict:
    """`model_dir/run.json` as a dict; `RunError` in one line when it is missing, is not
    JSON (a truncated copy) or records no model config."""
    path = pathlib.Path(model_dir) / RUN_FILE
    if not path.exists():
        raise RunError(f"{path} not found: {model_dir} is not a model directory written by train.py")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunError(f"{path} is not valid JSON ({error}); train.py writes it atomically, so the file was "
                       f"changed or copied incompletely: restore it from the run, or use a new --model-dir") from None
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise RunError(f"{path} records no model config: it is not a run.json written by train.py")
    return record


def _write_text_atomically(path: pathlib.Path, text: str) -> None:
    """`write_bytes_atomically` of UTF-8 text (line ends as given: csv's \\r\\n stay); a
    failed write raises `RunError` naming `path`."""
    try:
        write_bytes_atomically(path, text.encode("utf-8"))
    except OSError as error:
        raise RunError(f"cannot write {path}: {error.strerror}; the previous version is "
                       f"unchanged. Free space (or fix the permissions) and rerun the same command") from None


def _write_json_atomically(path: pathlib.Path, value) -> None:
    _write_text_atomically(path, json.dumps(value, indent=2))


def _compared(config: dict) -> dict:
    """The fields a resumed run must keep, normalised through `TransformerConfig`: fields
    added since a run started take their defaults, JSON lists compare equal to tuples."""
    try:
        config = TransformerConfig.from_dict(config).to_dict()
    except (TypeError, ValueError):  # not one of ours: compare as written
        pass
    return {k: v for k, v in config.items() if k not in SCHEDULE_ONLY_FIELDS}


def check_run_file(model_dir, config, tokenizer, data_args, fingerprint=None, allow_data_change=False,
                   accumulate=1, init_from=None):
    """Writes `run.json` for a new run; for an existing one, refuses a changed
    model config, tokenizer or data (resuming with them would silently mix runs).

    Args:
        model_dir: the run directory.
        config: the `TransformerConfig` of this invocation.
        tokenizer: its `Tokenizer` (the SHA-256 is recorded).
        data_args: `{"data", "source_lang", "target_lang"}`.
        fingerprint: `ParallelCorpus.fingerprint()` of the data (file sizes
            and hashes, or TFDS name and version); None skips that check.
        allow_data_change: resume on other data anyway; `run.json` then
            records the new data and keeps the old descriptions under
            `"previous_data"`.
        accumulate: batches per update (`TrainingConfig.accumulate`), recorded when
            above 1 (a run.json without it: 1); a resume may change it.
        init_from: the directory of the run whose weights this one started from
            (`TrainingConfig.init_from`), recorded for a new run (None: from scratch).
    """
    path = pathlib.Path(model_dir) / RUN_FILE
    data = dict(data_args)
    if fingerprint is not None:
        data["fingerprint"] = fingerprint
    record = {"config": config.to_dict(), "tokenizer_sha256": tokenizer.sha256, "data": data}
    if accumulate > 1:
        record["accumulate"] = accumulate
    if init_from is not None:
        record["init_from"] = os.fspath(init_from)
    if not path.exists():
        _write_json_atomically(path, record)
        return
    old = read_run_file(model_dir)
    check_run_tokenizer(model_dir, tokenizer)
    old_config = _compared(old["config"])  # read_run_file refuses a run.json without one
    new_config = _compared(record["config"])
    if old_config != new_config:
        changed = sorted(k for k in set(old_config) | set(new_config)
                         if old_config.get(k) != new_config.get(k))
        raise RunError(f"{path}: the existing run has a different model config ({', '.join(changed)}); "
                       f"use the same --config/--vocab-size/--max-length or a new --model-dir")
    # Another --accumulate goes on from the checkpoints (`CheckpointStore.restore_latest`): recorded.
    accumulate_changed = old.get("accumulate", 1) != accumulate
    old_data = dict(old.get("data") or {})
    old_fingerprint = old_data.pop("fingerprint", None)
    change = ""
    # The fingerprint is what the data holds, not where it lives: the same files at another path
    # (a directory moved, or copied to a job's local disk) are the run's data.
    moved = (old_data != data_args and fingerprint is not None and old_fingerprint == fingerprint
             and (old_data.get("source_lang"), old_data.get("target_lang")) == (data_args["source_lang"],
                                                                               data_args["target_lang"]))
    if moved:
        log.info("the run's data is at %s now (was %s): the same files by their sizes and SHA-256",
                 data_args["data"], old_data.get("data"))
    elif old_data != data_args:
        change = f"the existing run was trained on {old_data}, not {data_args}"
    elif fingerprint is not None and old_fingerprint is not None and old_fingerprint != fingerprint:
        from keras_transformer.data import describe_fingerprint_change

        change = (f"the training data changed since the run started "
                  f"({describe_fingerprint_change(old_fingerprint, fingerprint)})")
    if change and not allow_data_change:
        raise RunError(f"{path}: {change}; pass --allow-data-change to resume on it anyway, "
                       f"or use a new --model-dir")
    if change or moved or accumulate_changed or (fingerprint is not None and old_fingerprint is None):
        # Record the data now in use (an older run.json without a fingerprint gets one; an
        # allowed change keeps the history; moved data its new path), and the accumulation now in use.
        if change:
            record["previous_data"] = old.get("previous_data", []) + [old.get("data")]
        record["config"] = old["config"]
        merged = {**old, **record}
        if accumulate == 1:
            merged.pop("accumulate", None)
        _write_json_atomically(path, merged)


def load_config(model_dir):
    """The `TransformerConfig` recorded in `model_dir/run.json`."""
    return TransformerConfig.from_dict(read_run_file(model_dir)["config"])


def check_run_tokenizer(model_dir, tokenizer) -> None:
    """Raises `RunError` unless `tokenizer` is the one `run.json` records (resume and export)."""
    path = pathlib.Path(model_dir) / RUN_FILE
    recorded = read_run_file(model_dir).get("tokenizer_sha256") if path.exists() else None
    if recorded != tokenizer.sha256:
        source = tokenizer.path or "the tokenizer given"
        raise RunError(f"{source} has sha256 {tokenizer.sha256[:12]}..., but the run in {model_dir} "
                       f"was trained with a tokenizer of sha256 {str(recorded)[:12]}... ({path}); "
                       f"restore the run's tokenizer.model or use a new --model-dir")


def load_trained(model_dir, average=None, log=None):
    """Model, config and tokenizer of a `train.py` model directory: its averaged weights
    (`final.weights.h5`), or with `average=K` the mean of its newest K checkpoints
    (`checkpoint_model`: a run still training, or another K than the run averaged), then
    `log("averaged N checkpoint(s): NAMES")` when `log` is given, with the count the run
    keeps when it is below K (the exports' `--average 10` had averaged 4 without a word).

    Raises `RunError` (or `TokenizerError`) in one line when something is missing
    or does not belong to the run.
    """
    from keras_transformer.data import Tokenizer, check_vocab_size, tokenizer_path

    model_dir = pathlib.Path(model_dir)
    config = load_config(model_dir)
    tokenizer = Tokenizer.load(tokenizer_path(model_dir))
    check_run_tokenizer(model_dir, tokenizer)
    check_vocab_size(tokenizer, config.vocab_size)
    if average is not None:
        model, names = checkpoint_model(model_dir, config, tokenizer, average)
        if log is not None:
            fewer = f" ({average} asked; the run keeps {len(names)})" if len(names) < average else ""
            log(f"averaged {len(names)} checkpoint(s): {', '.join(names)}{fewer}")
        return model, config, tokenizer
    return final_model(model_dir, config), config, tokenizer


# The exports' `--average K` (export.saved_model, export.ctranslate2): `load_trained(average=K)`.
AVERAGE_HELP = ("export the mean of the run's newest K checkpoints instead of its final.weights.h5: a run still "
                "training, or another K than train.py averaged (a checkpoint written at a stop signal counts too)")


def checkpoint_model(model_dir, config, tokenizer, count):
    """`(model, names)`: `build_transformer(config)` with the element-wise mean of the run's
    newest `count` checkpoints (fewer if fewer are kept; `checkpoints.average_checkpoints`,
    the function `train.py` averages with), and the names of those averaged, oldest first.
    Unlike `train.py`'s average, a checkpoint written at a stop signal counts like the others.
    `RunError` in one line when there is none, or one was trained with another tokenizer."""
    import tensorflow as tf

    from keras_transformer.model import build_transformer
    from keras_transformer.training.checkpoints import CheckpointError, average_checkpoints, check_checkpoint_tokenizer

    if count < 1:
        raise RunError(f"the number of checkpoints to average must be positive, got {count}")
    directory = pathlib.Path(model_dir) / CHECKPOINT_DIR
    state = tf.train.get_checkpoint_state(str(directory)) if directory.is_dir() else None
    paths = list(state.all_model_checkpoint_paths) if state else []
    if not paths:
        raise RunError(f"{directory}: no checkpoints to average (train.py writes one every --checkpoint-every steps)")
    paths = [path if os.path.isabs(path) else str(directory / path) for path in paths[-count:]]
    model = build_transformer(config)
    try:
        for path in paths:
            check_checkpoint_tokenizer(path, tokenizer.sha256)
        average_checkpoints(model, paths)
    except CheckpointError as error:
        raise RunError(str(error)) from None
    return model, [os.path.basename(path) for path in paths]


def save_final_weights(model, config, model_dir) -> pathlib.Path:
    """Writes `model`'s weights (the architecture `config` describes) as
    `model_dir/final.weights.h5`, through a temporary file renamed into place: a reader
    sees the old file or the new one, never a part.

    Only the model's weights: Keras writes a compiled model's optimizer state into its
    weights file too (Adam's two moments, twice the weights again: 12.8 MB instead of
    4.4 MB for `tiny`), which here would be the last step's moments beside averaged
    weights, read by nothing. So the weights go through a model built from `config`.

    `RunError` in one line, before anything is written, when the disk has less free space
    than the file needs: once h5py fails a write for space, the HDF5 library holds a file
    it cannot close, prints a traceback for each object it frees and crashes the process
    at exit (SIGSEGV; a `tiny` run on a 45 MB tmpfs did, leaving a truncated
    `final.weights.h5`). A write that fails all the same removes its temporary file.
    """
    from keras_transformer.model import build_transformer

    path = pathlib.Path(model_dir) / FINAL_WEIGHTS
    weights = model.get_weights()
    data = sum(w.nbytes for w in weights)
    needed = data + data // 20 + 2**20  # HDF5's headers: 4.37 MB for `tiny`'s 4.16 MB of weights
    free = shutil.disk_usage(path.parent).free
    if free < needed:
        raise RunError(f"cannot write {path}: it needs {needed / 2**20:.1f} MiB and its disk has "
                       f"{free / 2**20:.1f} MiB free; the checkpoints are complete. Free space and rerun the same "
                       f"command: it averages them again")
    final = build_transformer(config)
    final.set_weights(weights)
    tmp = path.with_name(f".{path.name.removesuffix('.weights.h5')}.tmp-{os.getpid()}.weights.h5")
    with sigterm_raises():  # a SIGTERM or Ctrl-C while writing removes the temporary file (named by the pid)
        try:
            final.save_weights(tmp)
            os.replace(tmp, path)
        except (OSError, RuntimeError) as error:  # h5py raises both
            tmp.unlink(missing_ok=True)
            raise RunError(f"cannot write {path}: {write_failure(error)}; "
                           f"the checkpoints are complete. Free space (or fix the permissions) and rerun the same "
                           f"command: it averages them again") from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return path


def final_model(model_dir, config):
    """`build_transformer(config)` (in the global dtype policy) with the run's averaged
    weights, `model_dir/final.weights.h5`; `RunError` in one line when they are missing
    or do not fit."""
    from keras_transformer.model import build_transformer

    weights = pathlib.Path(model_dir) / FINAL_WEIGHTS
    if not weights.exists():
        import tensorflow as tf

        directory = pathlib.Path(model_dir) / CHECKPOINT_DIR
        newest = tf.train.latest_checkpoint(str(directory)) if directory.is_dir() else None
        # A run still training, or stopped before its end, has checkpoints that can be exported.
        instead = (f"; the run's newest checkpoint is {pathlib.Path(newest).name}: `--average K` of "
                   f"export.saved_model and export.ctranslate2 exports the mean of its newest K") if newest else ""
        raise RunError(f"{weights} not found: train.py writes it (the averaged checkpoints) when training "
                       f"ends{instead}")
    model = build_transformer(config)
    try:
        model.load_weights(weights)
    except (OSError, ValueError) as error:  # h5py: not an HDF5 file; Keras: other shapes or layers
        raise RunError(f"{weights} cannot be loaded into the model run.json describes ({error}); "
                       f"rerun train.py to average the checkpoints again") from None
    return model


def append_history(model_dir, row: dict) -> None:
    """Appends one row (keys from `HISTORY_COLUMNS`) to `history.csv`."""
    path = pathlib.Path(model_dir) / HISTORY_FILE
    new = not path.exists()
    columns = list(HISTORY_COLUMNS)
    if not new:  # a run started by an older version keeps its own columns
        with path.open(newline="") as f:
            columns = next(csv.reader(f), columns)
    # The whole file is written anew beside the old one and renamed over it: a crash or a
    # full disk mid-write leaves the previous history.csv, never a half row.
    old = ""
    if not new:
        with path.open(newline="", encoding="utf-8") as f:  # as written: csv's \r\n line ends kept
            old = f.read()
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    if new:
        writer.writeheader()
    writer.writerow({column: row.get(column, "") for column in columns})
    _write_text_atomically(path, old + buffer.getvalue())


def read_history(model_dir) -> list[dict]:
    """The rows of `history.csv` (strings; empty when a value was not measured)."""
    path = pathlib.Path(model_dir) / HISTORY_FILE
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def minutes_before(model_dir, step: int) -> float:
    """The training minutes that `history.csv` records up to `step` (a resumed run's first
    step): those of its last row at or before it, 0.0 when there is none. A resumed run's
    `minutes` go on from there, so that they sum the parts of a run trained in parts (each
    part from its start to its last round's row; a signal's stop mid-round loses at most
    that round's time)."""
    rows = [row for row in read_history(model_dir) if row.get("minutes") and int(row["step"]) <= step]
    return float(rows[-1]["minutes"]) if rows else 0.0


def write_results(model_dir, results: dict) -> pathlib.Path:
    """Writes `results.json` atomically."""
    path = pathlib.Path(model_dir) / RESULTS_FILE
    _write_json_atomically(path, results)
    return path
