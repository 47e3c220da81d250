"""Alignments: which source tokens each target token attends to, and word alignments on top.

`attention_alignments(model, source_ids, target_ids, target_lengths, layer=-1)` runs the model
once over a given translation (forced decoding, as `keras_transformer.inference.scoring`) and returns one
decoder layer's encoder-decoder attention averaged over its heads: for each target token (and
the final EOS), a distribution over the source tokens (and the source's EOS). The decoder is
causal, so for a translation the search produced these are the weights the search saw when it
chose each token; CTranslate2's `return_attention` gives the same for the same layer and heads
(`export.ctranslate2` converts with the last layer and every head averaged).

`word_alignments(source_pieces, target_pieces, attention)` turns them into word pairs: each
target word is aligned to the source word that its pieces attend to most (the attention of
its pieces summed over each source word's pieces), the "Pharaoh" pairs `i-j` that
fast_align and fairseq print.

Written in `keras.ops` (the first) and Python (the second).
"""

from __future__ import annotations

from keras import ops

from keras_transformer.inference.scoring import forced_decoding_ids

WORD_START = "\u2581"  # SentencePiece's marker of a piece that starts a word


def attention_alignments(model, source_ids, target_ids, target_lengths, layer=-1, source_features=None):
    """One decoder layer's encoder-decoder attention over a given translation, heads averaged.

    Args:
        model: a `Transformer` (`build_transformer`).
        source_ids: int `[batch, S]`: each source's tokens, EOS, PAD after.
        target_ids: int `[batch, T]`: the translation's tokens (no BOS, no EOS), PAD after.
        target_lengths: int `[batch]`.
        layer: the decoder layer (python int; -1: the last, as CTranslate2's default).
        source_features: a syntax-aware model's extra encoder inputs.

    Returns:
        float32 `[batch, T + 1, S]`: row `t <= length` is what target token `t` (row
        `length`: EOS) attends to, summing to 1 over the source's tokens and EOS (PAD
        columns 0); rows after a translation's end are 0.
    """
    depth = len(model.decoder_layers)
    if not -depth <= layer < depth:
        raise ValueError(f"layer={layer}: the decoder has {depth} layer(s) (0..{depth - 1}, or -1 for the last)")
    layer = layer % depth
    decoder_input, _ = forced_decoding_ids(target_ids, target_lengths)  # [batch, T + 1]
    encoded, source_mask = model.encode(source_ids, **(source_features or {}))
    y = model.embedding(decoder_input)  # [batch, T + 1, d_model] (the decoder's input, as `Transformer.decode`)
    for block in model.decoder_layers[:layer]:
        y = block(y, encoded, encoder_padding_mask=source_mask)
    weights = model.decoder_layers[layer].cross_attention_weights(y, encoded, source_mask)  # [b, heads, T + 1, S]
    averaged = ops.mean(weights, axis=1)  # [batch, T + 1, S]
    positions = ops.arange(ops.shape(averaged)[1], dtype="int32")  # [T + 1]
    rows = ops.expand_dims(positions, 0) <= ops.expand_dims(ops.cast(target_lengths, "int32"), 1)  # [batch, T + 1]
    return ops.where(ops.expand_dims(rows, 2), averaged, 0.0)


def _words(pieces):
    """The word index of each piece: a new word at every piece that starts with WORD_START
    (or at the first piece); control pieces such as "</s>" get None."""
    words, current = [], -1
    for piece in pieces:
        if piece.startswith("<") and piece.endswith(">"):
            words.append(None)
            continue
        if piece.startswith(WORD_START) or current < 0:
            current += 1
        words.append(current)
    return words


def word_alignments(source_pieces, target_pieces, attention):
    """Word pairs `(source word, target word)` from piece attention, one per target word.

    Args:
        source_pieces: the source's SentencePiece pieces (its EOS may follow: ignored).
        target_pieces: the translation's pieces (its EOS may follow: ignored).
        attention: `[len(target_pieces), len(source_pieces)]` (array-like), e.g. a row of
            `attention_alignments` cut to the two lengths.

    Returns:
        sorted list of `(i, j)`: target word `j` is aligned to source word `i` (word
        indices count from 0; `"-".join` them for the Pharaoh format). Each target word's
        source word is the one with the largest attention summed over both words' pieces.
    """
    source_words, target_words = _words(source_pieces), _words(target_pieces)
    mass = {}
    for t, target_word in enumerate(target_words):
        if target_word is None:
            continue
        for s, source_word in enumerate(source_words):
            if source_word is not None:
                mass[target_word, source_word] = mass.get((target_word, source_word), 0.0) + float(attention[t][s])
    best = {}
    for (target_word, source_word), value in sorted(mass.items()):
        if target_word not in best or value > best[target_word][1]:
            best[target_word] = (source_word, value)
    return sorted((source_word, target_word) for target_word, (source_word, _) in best.items())
