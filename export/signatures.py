"""The exported signatures (their names are `keras_transformer.constants`'), limits and
warm-up texts: what the export command (`export.saved_model`), its graph
(`export.saved_model_graph`), the LiteRT converter (`export.tflite`) and the translation
command (`export.translate`) agree on.

A leaf module: the standard library only (no TensorFlow, no Keras), so that each command's
`--help` and flag errors answer without loading them, and no module imports a name back
from a command module.
"""

from __future__ import annotations

import argparse
import typing

from keras_transformer.constants import (ADVANCED_SIGNATURE, ALIGN_SIGNATURE, LITERT_SIGNATURE, OPTIONS_SIGNATURE,
                                         SCORE_SIGNATURE, SERVING_DEFAULT, XLA_SIGNATURE)

if typing.TYPE_CHECKING:
    from keras_transformer.config import TransformerConfig

# (The names themselves are `keras_transformer.constants`', which the decoding options table
# reads too: the package imports nothing from export/.)
# Every signature of a plain-text model's export, in the order the module builds them, and
# those of a syntax-aware model (CoNLL-U in: no LiteRT or XLA variant).
# `serving_default` is always exported: TF Serving's default and the first warm-up request.
ALL_SIGNATURES = (SERVING_DEFAULT, OPTIONS_SIGNATURE, SCORE_SIGNATURE, ALIGN_SIGNATURE, LITERT_SIGNATURE,
                  XLA_SIGNATURE, ADVANCED_SIGNATURE)
SYNTAX_SIGNATURES = (SERVING_DEFAULT, OPTIONS_SIGNATURE, SCORE_SIGNATURE, ALIGN_SIGNATURE, ADVANCED_SIGNATURE)

# (`MAX_BEAM_SIZE`, in `keras_transformer.constants`: the beam sizes the options signature can
# run. One search takes the beam size at run time; it was one `switch_case` branch per beam
# size, eight copies of the search to export, load and instantiate at the first request
# (docs/lab-notebook, "Export and load time").)
# Most sentences per call of the LiteRT variant (see Translator.decode_ids);
# the LiteRT runner sends larger inputs in chunks.
LITERT_MAX_BATCH = 64
# (`MAX_PATIENCE`, `translate_options`' largest patience: `keras_transformer.constants`, which the options
# table's clip reads.)
# The warm-up requests' sentences (`assets.extra/tf_serving_warmup_requests`).
WARMUP_SENTENCES = ("Hello.", "This is a warm-up request for the translation model.", "")
# The same for a syntax-aware model's `conllu` input.
WARMUP_CONLLU = ("1\tHello\t_\tINTJ\t_\t_\t0\troot\t_\t_\n2\t.\t_\tPUNCT\t_\t_\t1\tpunct\t_\t_", "")


def chosen_signatures(config: TransformerConfig, names=None) -> tuple[str, ...]:
    """The signatures an export of `config`'s model holds: all of its kind when `names` is None,
    else `serving_default` and `names`, in `ALL_SIGNATURES`' order. A name that is no
    signature, or none a syntax-aware model has, is a ValueError naming it and the choices."""
    available = SYNTAX_SIGNATURES if config.syntax_aware else ALL_SIGNATURES
    if names is None:
        return available
    names = {names} if isinstance(names, str) else set(names)
    unknown = sorted(names - set(available))
    if unknown:
        kind = "a syntax-aware model's export" if config.syntax_aware else "an export"
        raise ValueError(f"{', '.join(unknown)}: not a signature of {kind}; choose among {', '.join(available)}")
    return tuple(name for name in available if name == SERVING_DEFAULT or name in names)


def signature_list(value: str) -> tuple[str, ...]:
    """`--signatures`: comma-separated names of `ALL_SIGNATURES` (a syntax-aware model's are
    checked against its own once it is loaded)."""
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in names if name not in ALL_SIGNATURES]
    if unknown:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown)}: not a signature; choose among "
                                         f"{', '.join(ALL_SIGNATURES)}")
    return names
