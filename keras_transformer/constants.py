"""Constants with a meaning, defined once for the whole project.

The special token ids are fixed here and nowhere else: the SentencePiece
trainer is told to use them (``pad_id``/``unk_id``/``bos_id``/``eos_id``),
the model masks ``PAD_ID``, and decoding starts at ``BOS_ID`` and stops at
``EOS_ID``.
"""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

# The UTF-8 byte order mark that Windows editors write before a file's first line; readers
# of text (corpora, CoNLL-U, export.translate's stdin) skip it.
UTF8_BOM = b"\xef\xbb\xbf"

# The SavedModel's signatures, by name: the export (`export.signatures`, which groups them by
# kind of model) and the decoding options table (`keras_transformer.decoding.options`, which
# says which signatures take each option) name them from here.
SERVING_DEFAULT = "serving_default"
OPTIONS_SIGNATURE = "translate_options"
LITERT_SIGNATURE = "translate_litert"
XLA_SIGNATURE = "translate_xla"
SCORE_SIGNATURE = "score"
ALIGN_SIGNATURE = "align"
ADVANCED_SIGNATURE = "translate_advanced"

# The largest beam of an export's `translate_options` signature: one search takes the beam
# size at run time (`beam_search(max_beam_size=...)`), larger requests are clipped to it, and
# `export.translate` refuses them.
MAX_BEAM_SIZE = 8

# The largest patience a served request gets (`translate_options`, `translate_advanced`; larger
# ones are clipped to it): round(8 * 1e6) finished hypotheses is more than any search finishes
# (at most 2 * beam a step), and stays an int32.
MAX_PATIENCE = 1e6

# The largest `no_repeat_ngram_size` given at run time (the SavedModel's `translate_advanced`):
# the search compares an n-gram's tokens in that many unrolled steps, masked to the size asked;
# a python int (`Translator.translate`) has no bound.
MAX_NO_REPEAT_NGRAM_SIZE = 8

# A large negative number used instead of -inf for masked attention logits and
# dead beams: -inf produces NaN in `inf - inf` and in softmax of an all-masked
# row, a finite value does not.
NEG_INF = -1e9

# Tag sets of the syntax-aware source factors (survey section 3, Eqs. 50-52):
# Universal Dependencies v2's 17 UPOS tags and its 37 universal relations
# (a language-specific subtype maps to its base: `nmod:poss` -> `nmod`). Fixed
# sets, so that any CoNLL-U a user's parser writes maps to the same ids at
# training and at serving time, with no vocabulary file to ship.
UPOS_TAGS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON",
             "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X")
DEPRELS = ("acl", "advcl", "advmod", "amod", "appos", "aux", "case", "cc", "ccomp", "clf", "compound",
           "conj", "cop", "csubj", "dep", "det", "discourse", "dislocated", "expl", "fixed", "flat",
           "goeswith", "iobj", "list", "mark", "nmod", "nsubj", "nummod", "obj", "obl", "orphan",
           "parataxis", "punct", "reparandum", "root", "vocative", "xcomp")
SOURCE_TAG_SETS = {"upos": UPOS_TAGS, "deprel": DEPRELS}
# Tag ids of one factor: 0 on padding, 1 for a tag not in the set, 2 on the
# source's EOS token (not a word), then the set's tags in order from 3.
TAG_PAD_ID = 0
TAG_UNK_ID = 1
TAG_EOS_ID = 2
TAG_OFFSET = 3
