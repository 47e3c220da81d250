"""keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3."""

import importlib.metadata as _metadata
import typing as _typing

from keras_transformer import console as _console

if _console.onednn_requested():  # train.py, export.translate: oneDNN kernels (before TensorFlow loads)
    _console.request_onednn()
if _console.quiet_requested():  # a command asked for quiet output (TensorFlow's first import made quiet)
    _console.quiet_tensorflow()

# Each public name and the module that defines it.
_MODULES = {
    "TransformerConfig": "config", "PRESETS": "config",
    "PAD_ID": "constants", "UNK_ID": "constants", "BOS_ID": "constants", "EOS_ID": "constants",
    "NEG_INF": "constants",
    "IncrementalDecoder": "inference.incremental",
    "DecoderBlock": "layers", "EncoderBlock": "layers", "FeedForward": "layers", "MultiHeadAttention": "layers",
    "PositionalEmbedding": "layers", "ResidualConnection": "layers",
    "LabelSmoothedCrossEntropy": "training.losses", "MaskedAccuracy": "training.losses",
    "Transformer": "model", "build_transformer": "model",
    "TransformerSchedule": "training.schedule", "make_optimizer": "training.schedule",
}

if _typing.TYPE_CHECKING or not _console.running_command():
    # A library user's `import keras_transformer` registers every layer with Keras, so that
    # `keras.saving.load_model` finds them.
    from keras_transformer.config import PRESETS, TransformerConfig
    from keras_transformer.constants import BOS_ID, EOS_ID, NEG_INF, PAD_ID, UNK_ID
    from keras_transformer.inference.incremental import IncrementalDecoder
    from keras_transformer.layers import (DecoderBlock, EncoderBlock, FeedForward, MultiHeadAttention,
                                          PositionalEmbedding, ResidualConnection)
    from keras_transformer.model import Transformer, build_transformer
    from keras_transformer.training.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
    from keras_transformer.training.schedule import TransformerSchedule, make_optimizer
else:
    # The project's commands import the modules they use, and these names load on first use:
    # `train.py --help` and its flag errors answer without Keras and TensorFlow.
    __getattr__ = _console.names_on_first_use(__name__, {name: f"{__name__}.{module}"
                                                         for name, module in _MODULES.items()})


def _version() -> str:
    """The installed distribution's version (pyproject.toml's when it was installed); a source
    tree on `sys.path` that was never installed reads its pyproject.toml."""
    try:
        return _metadata.version("keras-transformer")
    except _metadata.PackageNotFoundError:
        import pathlib
        import tomllib

        pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["version"]


# The exports record it (assets.extra/keras_transformer.json); docs/versions.md says what it promises.
__version__ = _version()

__all__ = [
    "TransformerConfig", "PRESETS", "Transformer", "build_transformer", "IncrementalDecoder",
    "MultiHeadAttention", "PositionalEmbedding", "FeedForward", "ResidualConnection",
    "EncoderBlock", "DecoderBlock", "TransformerSchedule", "make_optimizer",
    "LabelSmoothedCrossEntropy", "MaskedAccuracy",
    "PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID", "NEG_INF",
]
