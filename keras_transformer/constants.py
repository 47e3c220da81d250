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

# A large negative number used instead of -inf for masked attention logits and
# dead beams: -inf produces NaN in `inf - inf` and in softmax of an all-masked
# row, a finite value does not.
NEG_INF = -1e9
