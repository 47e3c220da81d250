"""The exporters' error types: a conversion that cannot be made as asked and an
export that cannot be written (one-line messages for the command line), and the
commands' shared check of a SavedModel path (a version directory, or the newest version
under an export or model directory)."""

import os


class ConversionError(ValueError):
    """A model, an option or a converted result that an exporter refuses: the options
    asked for something it cannot give (CTranslate2), or the converted model would not
    run where it is going (LiteRT with TF Text's kernels)."""


class ExportWriteError(OSError):
    """An export that could not be written (a full disk, no permission); what it had
    written is removed, so no half-written version is left where a server looks."""


def missing_saved_model(path) -> str | None:
    """Why `path` is not a SavedModel directory (no `saved_model.pb` in it), in one line for
    a command's error, or None when it is one. A user who passes the export directory
    instead of its version directory gets told which to give."""
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return None
    return f"{path}: no saved_model.pb there; give an export version directory such as MODEL_DIR/export/1"


def newest_version(path) -> str | None:
    """The SavedModel a command given `path` should load, or None when there is none: `path`
    itself when it holds `saved_model.pb`; else, as TF Serving reads a model's base path, its
    version directory of the highest number (`EXPORT/10` before `EXPORT/9`) that holds one;
    else the same in `path/export` (a model directory of `train.py`). Directories that are not
    a non-negative integer (an export being written, `.tmp-VERSION-PID`) are not versions."""
    if missing_saved_model(path) is None:
        return str(path)
    for base in (path, os.path.join(path, "export")):
        try:
            names = os.listdir(base)
        except OSError:  # no such directory, a file, no permission
            continue
        versions = sorted((int(name), name) for name in names
                          if name.isdigit() and missing_saved_model(os.path.join(base, name)) is None)
        if versions:
            return os.path.join(base, versions[-1][1])
    return None


def output_problem(path, directory: bool) -> str | None:
    """Why `path` cannot be written, in one line for a command's error, or None: checked
    before a conversion's seconds or minutes, which were spent before `[Errno 17] File
    exists` or a permission error came. `directory`: `path` is a directory to make or fill
    (an export base); otherwise a file, whose directory is made if missing."""
    target = os.path.abspath(path if directory else os.path.dirname(os.path.abspath(path)))
    existing = target
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{path}: {existing} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{path}: {existing} is not writable"
    return None
