"""`saved_model_cli` with tensorflow-text's ops registered.

The exported graph contains `TFText>FastSentencepieceTokenize` and
`TFText>FastSentencepieceDetokenize`. TF Serving links those ops, but the
stock `saved_model_cli` only loads core TensorFlow and fails with "Op type not
registered". This wrapper imports `tensorflow_text` (which registers them)
and then runs the stock tool with the same arguments:

    python -m export.saved_model_cli run --dir EXPORT/1 --tag_set serve \\
        --signature_def serving_default --input_exprs 'text=["A sentence."]'
"""

import sys

import keras_transformer  # noqa: F401  (a command: TensorFlow imported without its start-up lines)
import tensorflow_text  # noqa: F401  (registers the TFText ops)
from tensorflow.python.platform import tf_logging
from tensorflow.python.tools import saved_model_cli

from export.errors import missing_saved_model
from keras_transformer.console import quiet_requested, stops_quietly_for_a_closed_pipe


def quiet_stock_tool():
    """The stock tool's `main` sets TensorFlow's logger to INFO before it runs, so the quiet
    console's level did not hold: its own call of the deprecated TF1 loader and the loader's
    "Restoring parameters from ..." printed twice each (TensorFlow's handler, then absl's) above
    the results. Unless `--verbose`, the logger stays at ERROR."""
    tf_logging.set_verbosity(tf_logging.ERROR)
    saved_model_cli.logging = _KeepVerbosity(tf_logging)


class _KeepVerbosity:
    """`tf_logging` as the stock tool sees it, less `set_verbosity`."""

    def __init__(self, module):
        self._module = module

    def set_verbosity(self, level):
        pass

    def __getattr__(self, name):
        return getattr(self._module, name)


@stops_quietly_for_a_closed_pipe
def main(argv=None) -> int:
    """Checks `--dir` (one line, exit 2, where the stock tool raised a traceback), then runs
    the stock tool on the arguments (`sys.argv[1:]`), less our `--verbose`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for index, arg in enumerate(argv):
        path = (argv[index + 1] if arg == "--dir" and index + 1 < len(argv)
                else arg[len("--dir="):] if arg.startswith("--dir=") else None)
        missing = path and missing_saved_model(path)
        if missing:
            print(f"export.saved_model_cli: error: --dir {missing}", file=sys.stderr)
            return 2
    if "--verbose" in argv:
        argv.remove("--verbose")  # ours (console.quiet_requested), not the stock tool's
    elif quiet_requested():
        quiet_stock_tool()
    sys.argv[:] = ["saved_model_cli", *argv]  # the stock tool parses sys.argv
    return saved_model_cli.main()


if __name__ == "__main__":
    sys.exit(main())
