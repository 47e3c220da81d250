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
from tensorflow.python.tools import saved_model_cli

if __name__ == "__main__":
    sys.argv[0] = "saved_model_cli"
    sys.exit(saved_model_cli.main())
