"""Atomic file writes and the reason a write failed, in a few words: the leaf helpers that
the run directory (`run_dir`), the checkpoints, the tokenizer and the exports share.

The standard library only: any module may import it without an import circle, and without
loading TensorFlow.
"""

from __future__ import annotations

import os
import pathlib
import re


def write_failure(error: BaseException) -> str:
    """Why a write failed, in a few words for a one-line error: ``No space left on device``
    of an `OSError`, or of a TensorFlow error such as ``{{function_node
    __wrapped__SaveV2...}} DIR/ckpt-9_temp/part-...; No space left on device [Op:SaveV2]``
    (TensorFlow's file errors end ``<file>; <the system's reason>``)."""
    text = (getattr(error, "strerror", None) or getattr(error, "message", None) or str(error)).strip()
    text = text.splitlines()[0] if text else type(error).__name__
    text = re.sub(r"\s*\[Op:\w+\]$", "", re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", text))
    if hasattr(error, "error_code") and "; " in text:  # a TensorFlow OpError
        text = text.rsplit("; ", 1)[-1]
    return text


def write_bytes_atomically(path, data: bytes) -> pathlib.Path:
    """Writes `data` to a temporary file beside `path` (``NAME.tmp``) and renames it over
    `path`: readers see the old file or the new one, never a part. A failed write (a full
    disk) removes the temporary file, which had kept what fitted (98 KB of a 100 KB disk
    for a tokenizer, 3 MB of a 3 MB one for a LiteRT model), and raises `OSError` with
    `path` as its ``filename`` and `write_failure`'s reason."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise OSError(error.errno, write_failure(error), str(path)) from None
    return path
