"""The layout of a model directory written by `train.py` and read by `export/`.

    MODEL_DIR/
      tokenizer.model      shared SentencePiece vocabulary
      run.json             model config, tokenizer SHA-256, data description
      checkpoints/         ckpt-<step>.* and the `checkpoint` state file
      logs/                TensorBoard
      history.csv          loss / validation loss / BLEU per checkpoint
      curves.png           the same as a plot
      final.weights.h5     the average of the last K checkpoints
      results.json         final figures
      export/<version>/    SavedModel for TF Serving
"""

from __future__ import annotations

import json
import os
import pathlib

from keras_transformer.config import TransformerConfig

RUN_FILE = "run.json"
HISTORY_FILE = "history.csv"
CURVE_FILE = "curves.png"
CHECKPOINT_DIR = "checkpoints"
FINAL_WEIGHTS = "final.weights.h5"


class RunError(RuntimeError):
    """A user-facing problem with the run's flags or model directory."""


def check_run_file(model_dir, config, tokenizer, data_args):
    """Writes `run.json` for a new run; for an existing one, refuses a changed
    model config, tokenizer or data (resuming with them would silently mix runs)."""
    path = pathlib.Path(model_dir) / RUN_FILE
    record = {"config": config.to_dict(), "tokenizer_sha256": tokenizer.sha256, "data": data_args}
    if path.exists():
        old = json.loads(path.read_text())
        check_tokenizer(model_dir, tokenizer)
        if old.get("config") != record["config"]:
            changed = sorted(k for k in record["config"] if old["config"].get(k) != record["config"][k])
            raise RunError(f"{path}: the existing run has a different model config ({', '.join(changed)}); "
                           f"use the same --config/--vocab-size/--max-length or a new --model-dir")
        if old.get("data") != data_args:
            raise RunError(f"{path}: the existing run was trained on {old.get('data')}, not {data_args}; "
                           f"use a new --model-dir")
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, path)


def load_config(model_dir):
    """The `TransformerConfig` recorded in `model_dir/run.json`."""
    path = pathlib.Path(model_dir) / RUN_FILE
    if not path.exists():
        raise RunError(f"{path} not found: {model_dir} is not a model directory written by train.py")
    return TransformerConfig.from_dict(json.loads(path.read_text())["config"])


def check_tokenizer(model_dir, tokenizer) -> None:
    """Raises `RunError` unless `tokenizer` is the one `run.json` records (resume and export)."""
    path = pathlib.Path(model_dir) / RUN_FILE
    recorded = json.loads(path.read_text()).get("tokenizer_sha256") if path.exists() else None
    if recorded != tokenizer.sha256:
        source = tokenizer.path or "the tokenizer given"
        raise RunError(f"{source} has sha256 {tokenizer.sha256[:12]}..., but the run in {model_dir} "
                       f"was trained with a tokenizer of sha256 {str(recorded)[:12]}... ({path}); "
                       f"restore the run's tokenizer.model or use a new --model-dir")
