"""The exporters' one error type: a conversion that cannot be made as asked (a
one-line message for the command line), and the commands' shared check of a SavedModel
path."""

import os


class ConversionError(ValueError):
    """A model, an option or a converted result that an exporter refuses: the options
    asked for something it cannot give (CTranslate2), or the converted model would not
    run where it is going (LiteRT with TF Text's kernels)."""


def missing_saved_model(path) -> str | None:
    """Why `path` is not a SavedModel directory (no `saved_model.pb` in it), in one line for
    a command's error, or None when it is one. A user who passes the export directory
    instead of its version directory gets told which to give."""
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return None
    return f"{path}: no saved_model.pb there; give an export version directory such as MODEL_DIR/export/1"
