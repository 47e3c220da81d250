"""Trains the Transformer (the training pipeline lands with issue #3).

Until then this prints the model summary of a preset and says so.
"""

import argparse
import sys

from keras_transformer import TransformerConfig, build_transformer


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="tiny", help="preset: base, big, small or tiny")
    args = parser.parse_args(argv)
    build_transformer(TransformerConfig.from_preset(args.config)).summary()
    print("training: not yet implemented (issue #3)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
