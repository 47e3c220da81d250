"""`saved_model_cli` with tensorflow-text's ops registered.

The exported graph contains `TFText>FastSentencepieceTokenize` and
`TFText>FastSentencepieceDetokenize`. TF Serving links those ops, but the
stock `saved_model_cli` only loads core TensorFlow and fails with "Op type not
registered". This wrapper imports `tensorflow_text` (which registers them)
and then runs the stock tool with the same arguments:

    python -m export.saved_model_cli run --dir EXPORT/1 --tag_set serve \\
        --signature_def serving_default --input_exprs 'text=["A sentence."]'
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow_text  # noqa: E402,F401  (registers the TFText ops)
from tensorflow.python.tools import saved_model_cli  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "saved_model_cli"
    sys.exit(saved_model_cli.main())
