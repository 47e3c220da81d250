"""Annotated sources as TensorFlow ops: CoNLL-U text -> the syntax-aware model's inputs.

One function, `annotated_features`, turns CoNLL-U blocks (one sentence per
string, as a parser writes them) into what `Transformer.encode` takes:

    CoNLL-U --parse--> words, UPOS, DEPREL, HEAD
            --FastSentencepieceTokenize per word--> pieces (each inherits its word's tags)
            --tree distances between words (matmuls), gathered per piece--> source_distances

It is all graph ops, so the training pipeline (`make_batches(...,
annotated=True)`) and the exported SavedModel's annotated signature run the
very same code: serving cannot drift from training. `syntax.py` holds the
NumPy references the tests compare against.

Conventions:

* CoNLL-U as users have it: `#` comments, multiword token ranges (`3-4`)
  and empty nodes (`8.1`) are skipped, other columns ignored; HEAD is the
  1-based word id, 0 for the root.
* The source's EOS token stands for CoNLL-U's root node 0: it is the parent
  of the root word (one edge away), so EOS and the words form one tree and
  `omega` is a tree distance between every pair of source tokens.
* Tags map to ids by the fixed sets in `constants` (`TAG_OFFSET + index`,
  `TAG_UNK_ID` for others, a relation's subtype is dropped: `nmod:poss` ->
  `nmod`); EOS gets `TAG_EOS_ID`, padding `TAG_PAD_ID`.
* Distances: `omega(i, j) = depth(i) + depth(j) - 2 depth(lca(i, j))`, from
  the ancestor matrix `R` (`R[i, k] = 1` when `k` is `i` or an ancestor of
  `i`), which repeated squaring of `I + parent` gives in `log2(n)` matmuls:
  `depth(i) = sum_k R[i, k] - 1` and `depth(lca(i, j)) + 1 = (R R^T)[i, j]`.
* A malformed sentence (a word line without 10 tab-separated columns, a
  HEAD that is not a number, names no word or does not lead to the root)
  is found per sentence (`sentence_errors`, one message per sentence, ""
  when it is well-formed). By default (`strict=True`, training) it fails
  with an InvalidArgumentError naming the problem; with `strict=False`
  (the served signatures) the sentence becomes an empty source and its
  message is returned, so the other sentences of a request still translate.
"""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.constants import (DEPRELS, EOS_ID, PAD_ID, SOURCE_TAG_SETS, TAG_EOS_ID, TAG_OFFSET,
                                         TAG_PAD_ID, TAG_UNK_ID, UPOS_TAGS)

# CoNLL-U columns.
CONLLU_COLUMNS = 10
ID, FORM, UPOS, HEAD, DEPREL = 0, 1, 3, 6, 7


# The problems `sentence_errors` names, in the order they are checked (a sentence
# with several gets the first).
COLUMNS_ERROR = "CoNLL-U: every word line needs 10 tab-separated columns"
HEAD_FORMAT_ERROR = "CoNLL-U: HEAD must be a word id (0 for the root)"
HEAD_RANGE_ERROR = "CoNLL-U: a HEAD names no word of its sentence"
CYCLE_ERROR = "CoNLL-U: a HEAD does not lead to the root (a cycle)"


def _parse_columns(blocks):
    """CoNLL-U blocks -> the per-word columns (as `parse_conllu`) and the sentence's
    format problem: a string `[batch]`, `COLUMNS_ERROR`, `HEAD_FORMAT_ERROR` or ""."""
    blocks = tf.convert_to_tensor(blocks, tf.string)
    nrows = tf.shape(blocks, out_type=tf.int64)[0]
    lines = tf.strings.split(blocks, "\n")  # ragged [batch, (lines)]
    flat = tf.strings.strip(lines.flat_values)  # [lines]
    sentence_of_line = lines.value_rowids()  # [lines]
    keep = tf.logical_and(tf.strings.length(flat) > 0, tf.logical_not(tf.strings.regex_full_match(flat, "#.*")))
    flat, sentence_of_line = tf.boolean_mask(flat, keep), tf.boolean_mask(sentence_of_line, keep)
    columns = tf.strings.split(flat, "\t")  # ragged [lines, (columns)]
    bad_line = tf.not_equal(columns.row_lengths(), CONLLU_COLUMNS)  # [lines]
    columns = columns.to_tensor(default_value="", shape=[None, CONLLU_COLUMNS])  # [lines, 10]
    is_word = tf.strings.regex_full_match(columns[:, ID], "[0-9]+")  # not 3-4 (range), not 8.1 (empty node)
    bad_columns = _any_per_sentence(bad_line, sentence_of_line, nrows)  # [batch]
    columns, sentence_of_line = tf.boolean_mask(columns, is_word), tf.boolean_mask(sentence_of_line, is_word)
    head_text = columns[:, HEAD]
    numeric = tf.strings.regex_full_match(head_text, "[0-9]+")  # [words]
    bad_head = _any_per_sentence(tf.logical_not(numeric), sentence_of_line, nrows)  # [batch]
    # A bad sentence's HEADs still become numbers (its rows are dropped or refused later).
    heads = tf.strings.to_number(tf.where(numeric, head_text, "0"), tf.int32)

    def ragged(values):
        return tf.RaggedTensor.from_value_rowids(values, sentence_of_line, nrows=nrows)

    errors = tf.where(bad_columns, COLUMNS_ERROR, tf.where(bad_head, HEAD_FORMAT_ERROR, ""))  # [batch]
    return {"words": ragged(columns[:, FORM]), "upos": ragged(columns[:, UPOS]),
            "deprel": ragged(columns[:, DEPREL]), "heads": ragged(heads)}, errors


def _any_per_sentence(flags, sentence_of_item, nrows):
    """bool `[items]` -> bool `[batch]`: whether any item of each sentence is set."""
    counts = tf.math.unsorted_segment_sum(tf.cast(flags, tf.int32), tf.cast(sentence_of_item, tf.int32),
                                          tf.cast(nrows, tf.int32))
    return counts > 0


def _refuse(errors):
    """Fails (InvalidArgumentError) naming the first sentence problem in `errors` string `[batch]`."""
    bad = tf.not_equal(errors, "")
    tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [tf.boolean_mask(errors, bad)], summarize=3)


def parse_conllu(blocks):
    """CoNLL-U blocks -> per-word columns; a malformed sentence fails
    (InvalidArgumentError naming the problem).

    Args:
        blocks: string `[batch]`, one sentence's CoNLL-U lines each.

    Returns:
        dict of ragged `[batch, (words)]`: `words`, `upos`, `deprel`
        (strings) and `heads` (int32, 1-based, 0 for the root).
    """
    columns, errors = _parse_columns(blocks)
    _refuse(errors)
    return columns


def tag_ids(tags, name):
    """Tag strings (a dense tensor) -> ids of the factor `name` (`"upos"`, `"deprel"`)."""
    if name == "deprel":
        tags = tf.strings.regex_replace(tf.strings.lower(tags), ":.*", "")
        vocabulary = DEPRELS
    elif name == "upos":
        tags = tf.strings.upper(tags)
        vocabulary = UPOS_TAGS
    else:
        raise ValueError(f"unknown tag factor {name!r}, expected one of {sorted(SOURCE_TAG_SETS)}")
    matches = tf.equal(tf.expand_dims(tags, -1), tf.constant(vocabulary))  # [..., |set|]
    index = tf.argmax(tf.cast(matches, tf.int32), axis=-1, output_type=tf.int32)
    return tf.where(tf.reduce_any(matches, axis=-1), index + TAG_OFFSET, TAG_UNK_ID)


def tree_distances(heads):
    """Edges between the nodes of dependency trees, node 0 being the root node;
    a HEAD that names no word or does not lead to the root fails
    (InvalidArgumentError naming the problem).

    Args:
        heads: int32 ragged `[batch, (n)]`, CoNLL-U HEADs (1-based, 0 = root).

    Returns:
        int32 `[batch, N + 1, N + 1]` with `N = max(n)`: `omega` between
        nodes `0..n` (node `k` is word `k`, node 0 the root node); rows and
        columns past `n` are 0.
    """
    omega, errors = _tree(heads)
    _refuse(errors)
    return omega


def _tree(heads):
    """`tree_distances` and each sentence's tree problem, string `[batch]`
    (`HEAD_RANGE_ERROR`, `CYCLE_ERROR` or ""). A bad tree's `omega` is
    meaningless except between node 0 and itself (0)."""
    counts = tf.cast(heads.row_lengths(), tf.int32)  # [batch]
    width = tf.reduce_max(tf.concat([counts, [0]], 0)) + 1  # N + 1 nodes
    dense = heads.to_tensor(default_value=-1, shape=[None, None])  # [batch, N]
    dense = tf.pad(dense, [[0, 0], [1, width - 1 - tf.shape(dense)[1]]], constant_values=-1)  # [batch, N + 1]
    real = tf.sequence_mask(counts + 1, width)  # [batch, N + 1], node 0 and the words
    is_word = tf.logical_and(real, tf.range(width)[tf.newaxis, :] > 0)
    in_range = tf.logical_and(dense >= 0, dense <= counts[:, tf.newaxis])  # [batch, N + 1]
    bad_range = tf.reduce_any(tf.logical_and(is_word, tf.logical_not(in_range)), axis=1)  # [batch]
    parent = tf.one_hot(tf.where(is_word, dense, -1), width, dtype=tf.float32)  # [batch, N + 1, N + 1]
    reach = tf.minimum(parent + tf.eye(width, batch_shape=[1]), 1.0)  # ancestors within one edge
    steps = tf.cast(tf.math.ceil(tf.math.log(tf.cast(width, tf.float32) + 1.0) / tf.math.log(2.0)), tf.int32)
    reach = tf.while_loop(lambda i, r: i < steps,
                          lambda i, r: (i + 1, tf.minimum(tf.matmul(r, r), 1.0)),
                          (tf.constant(0), reach))[1]  # [batch, N + 1, N + 1]: ancestors at any depth
    cycle = tf.reduce_any(tf.logical_and(is_word, tf.logical_not(reach[:, :, 0] > 0)), axis=1)  # [batch]
    depth = tf.reduce_sum(reach, axis=-1) - 1.0  # [batch, N + 1]
    common = tf.matmul(reach, reach, transpose_b=True)  # [batch, N + 1, N + 1]: depth(lca) + 1
    omega = depth[:, :, tf.newaxis] + depth[:, tf.newaxis, :] - 2.0 * (common - 1.0)
    pair_real = tf.logical_and(real[:, :, tf.newaxis], real[:, tf.newaxis, :])
    errors = tf.where(bad_range, HEAD_RANGE_ERROR, tf.where(cycle, CYCLE_ERROR, ""))  # [batch]
    return tf.where(pair_real, tf.cast(tf.round(omega), tf.int32), 0), errors


def sentence_errors(blocks):
    """CoNLL-U blocks -> (columns, errors): the per-word columns of `parse_conllu`
    plus `omega` (`tree_distances` of their HEADs, not checked), and each
    sentence's first problem, string `[batch]`: `COLUMNS_ERROR`,
    `HEAD_FORMAT_ERROR`, `HEAD_RANGE_ERROR`, `CYCLE_ERROR`, or "" when the
    sentence is well-formed."""
    columns, errors = _parse_columns(blocks)
    omega, tree_errors = _tree(columns["heads"])
    return {**columns, "omega": omega}, tf.where(tf.equal(errors, ""), tree_errors, errors)


def annotated_features(blocks, tokenizer, max_length, tag_factors=("upos", "deprel"), truncate=True,
                       strict=True):
    """CoNLL-U blocks -> the syntax-aware model's source inputs.

    Each word is tokenized on its own, so its pieces follow one another and
    inherit its tags and its tree distances (pieces of one word are 0 apart);
    EOS follows the last piece. The source is the words joined by spaces:
    SentencePiece never merges across a space, so the pieces are those of
    `" ".join(words)`.

    Args:
        blocks: string `[batch]` of CoNLL-U sentences.
        tokenizer: a `tensorflow_text.FastSentencepieceTokenizer` (or anything
            with `tokenize(strings [n]) -> ragged [n, (pieces)]`).
        max_length: longest source in tokens with EOS.
        tag_factors: the tag factors to return, in order.
        truncate: cut sources to `max_length - 1` pieces (serving); False
            keeps every piece (training drops overlong pairs by the lengths).
        strict: True fails (InvalidArgumentError naming the problem) on a
            malformed sentence; False (the served signatures) makes it an
            empty source (no pieces: EOS only) and names its problem in
            `errors`.

    Returns:
        dict: `source_ids` int32 `[batch, S]` (pieces, EOS, PAD),
        `source_lengths` int32 `[batch]` (pieces without EOS),
        `source_tags` int32 `[batch, S, len(tag_factors)]` (only with tag factors),
        `source_distances` int32 `[batch, S, S]` (0 on padding),
        `text` string `[batch]` (the words joined by spaces),
        `errors` string `[batch]` (each sentence's problem, "" when it is
        well-formed; all "" with `strict`).
    """
    columns, errors = sentence_errors(blocks)
    omega = columns.pop("omega")  # [batch, N + 1, N + 1]
    if strict:
        _refuse(errors)
    else:  # a malformed sentence keeps no word: an empty source (EOS only), omega 0 on node 0
        keep = tf.gather(tf.equal(errors, ""), columns["words"].value_rowids())  # [words]
        columns = {name: tf.ragged.boolean_mask(values, values.with_flat_values(keep))
                   for name, values in columns.items()}
    words = columns["words"]  # ragged [batch, (n)]
    pieces = tokenizer.tokenize(words.flat_values)  # ragged [words, (pieces)]
    pieces_per_word = tf.cast(pieces.row_lengths(), tf.int32)  # [words]
    # 1-based word (node) number of each piece within its sentence.
    word_numbers = tf.cast(tf.ragged.range(words.row_lengths()).flat_values + 1, tf.int32)  # [words]
    piece_nodes = tf.repeat(word_numbers, pieces_per_word)  # [pieces]
    pieces_per_sentence = tf.reduce_sum(
        tf.RaggedTensor.from_row_lengths(pieces_per_word, words.row_lengths()), axis=1)  # [batch]
    lengths = tf.cast(pieces_per_sentence, tf.int32)  # [batch]
    if truncate:
        lengths = tf.minimum(lengths, max_length - 1)
    batch = tf.shape(lengths)[0]
    width = tf.reduce_max(tf.concat([lengths, [0]], 0)) + 1  # with EOS
    flat_ids = tf.cast(pieces.flat_values, tf.int32)
    sentence_pieces = tf.RaggedTensor.from_row_lengths(flat_ids, tf.cast(pieces_per_sentence, tf.int64))
    sentence_nodes = tf.RaggedTensor.from_row_lengths(piece_nodes, tf.cast(pieces_per_sentence, tf.int64))
    shape = tf.stack([batch, width])
    ids = sentence_pieces.to_tensor(default_value=PAD_ID, shape=shape)  # [batch, S] (cut to S)
    nodes = sentence_nodes.to_tensor(default_value=0, shape=shape)  # [batch, S]: 0 on EOS and PAD
    positions = tf.range(width)[tf.newaxis, :]  # [1, S]
    real = positions < lengths[:, tf.newaxis]  # [batch, S] pieces
    eos = positions == lengths[:, tf.newaxis]
    ids = tf.where(eos, EOS_ID, tf.where(real, ids, PAD_ID))
    nodes = tf.where(real, nodes, 0)
    token_mask = tf.logical_or(real, eos)

    rows = tf.gather(omega, nodes, axis=1, batch_dims=1)  # [batch, S, N + 1]
    distances = tf.gather(rows, nodes, axis=2, batch_dims=1)  # [batch, S, S]
    pair_mask = tf.logical_and(token_mask[:, :, tf.newaxis], token_mask[:, tf.newaxis, :])
    distances = tf.where(pair_mask, distances, 0)

    factors = []
    for name in tag_factors:
        word_tags = tf.ragged.map_flat_values(tag_ids, columns[name], name)
        word_tags = word_tags.to_tensor(default_value=TAG_PAD_ID)  # [batch, N]
        word_tags = tf.pad(word_tags, [[0, 0], [1, 0]], constant_values=TAG_EOS_ID)  # node 0 = EOS
        piece_tags = tf.gather(word_tags, nodes, batch_dims=1)  # [batch, S]
        factors.append(tf.where(real, piece_tags, tf.where(eos, TAG_EOS_ID, TAG_PAD_ID)))
    features = {"source_ids": ids, "source_lengths": lengths, "source_distances": distances,
                "text": tf.strings.reduce_join(words, axis=-1, separator=" "), "errors": errors}
    if factors:  # no zero-width tensor without factors: tf.data's unbatch crashes on one (TF 2.21)
        features["source_tags"] = tf.stack(factors, axis=-1)
    return features
