"""Strings in, translations out, as one TensorFlow graph.

`Translator` chains the pieces a served model needs, all as TensorFlow ops:

    text --(input hygiene)--> FastSentencepieceTokenize --> source ids
         --> encoder --> cached beam search over the decoder --> ids
         --> FastSentencepieceDetokenize --> translation, score

A syntax-aware model (`config.syntax_aware`) takes CoNLL-U instead of text:
`keras_transformer.data.annotated` parses it, tokenizes each word and
computes the tags and tree distances in the graph, as the training pipeline
does; the search is the plain-graph one (the XLA variant is for plain text).

Training (`keras_transformer.training`) computes its BLEU through the same `Translator` that the
SavedModel exports, so evaluation and serving cannot drift apart.

The ids-to-ids search is `keras_transformer.inference.searcher.Searcher`
(`Translator.searcher`), in two ways (same translations): the plain
TensorFlow graph (`xla=False`), what TF Serving runs by default, and the
XLA-compiled search (`xla=True`), with the string ops outside it since they
have no XLA kernels. `translate`, hence training's BLEU, runs the plain
graph by default, as `export.translate` calls `serving_default`: a run meets
each (length, batch) bucket a few times, and XLA's compile of each costs more
than it saves (docs/lab-notebook, "Training's BLEU in the plain graph"). The
export's `translate_xla` signature is the XLA one, for servers that warm it up.
"""

from __future__ import annotations

import typing

import tensorflow as tf
import tensorflow_text as tf_text

from keras_transformer.config import TransformerConfig
from keras_transformer.constants import EOS_ID, PAD_ID
from keras_transformer.data.annotated import annotated_features
from keras_transformer.decoding import options as decoding_options
from keras_transformer.decoding import SearchOptions
from keras_transformer.model import source_feature_names
from keras_transformer.inference.alignment import attention_alignments, word_alignments
from keras_transformer.inference.scoring import score_tokens
from keras_transformer.inference.searcher import XLA_BATCH_HALVINGS, Searcher, not_converted

# `Translator.translate(xla=True)` (in our own process) runs a few batches per
# shape, not a server's many: the branches' compile time (13.6 s instead of
# 5.6 s for a batch-32 bucket of the Multi30k model) would cost more than the
# halving saves, so it searches without them (same translations).
IN_PROCESS_BATCH_HALVINGS = 0

# Characters kept from one input before tokenization. A SentencePiece piece
# is at most 16 characters, so `16 * max_length` characters always yield at
# least `max_length` tokens when the text is that long: the cut never
# shortens what the model would see, and a megabyte-long request costs no
# more than a long sentence.
CHARS_PER_TOKEN_BOUND = 16


class AlignedTranslation(typing.NamedTuple):
    """One (source, translation) pair as `Translator.align` aligns it: the pieces of both
    (each ending with EOS), `attention[t][s]` (what target piece `t` attends to, heads of
    one layer averaged) and the word pairs `(source word, target word)`."""

    source_tokens: list
    target_tokens: list
    attention: list
    words: list


class ScoredTranslation(typing.NamedTuple):
    """One (source, target) pair as `Translator.score` scores it: the target's
    log-probability (`score`, the sum of `token_scores`), its SentencePiece pieces and EOS
    (`tokens`), and the log-probability of each (`token_scores`)."""

    score: float
    tokens: list
    token_scores: list


class Translator:
    """Tokenizer + the model's `Searcher` + detokenizer, callable in eager mode or in a graph.

    Args:
        model: a `keras.Model` from `build_transformer(config)`.
        config: its `TransformerConfig` (max_length, beam, alpha, +50 rule).
        tokenizer_model: the SentencePiece model bytes (`Tokenizer.model_bytes`).
        logits_filter: the search's `Searcher(logits_filter=...)`: None, or a
            function `logits [rows, vocab] -> logits` applied to the decoder's
            output at every step before the search scores it.
        output_kernel: the search's `Searcher(output_kernel=...)`: None, or a stored
            copy of the output projection's matrix (the export's).

    Example:
        >>> translator = Translator(model, config, tokenizer.model_bytes)
        >>> translator.translate(["Today the man sees the dog."])
        ['Heute sieht der Mann den Hund.']
    """

    def __init__(self, model, config: TransformerConfig, tokenizer_model: bytes, logits_filter=None,
                 output_kernel=None):
        self.model = model
        self.config = config
        self.searcher = Searcher(model, config, logits_filter, output_kernel)
        self.sentencepiece_model = tokenizer_model
        self.sentencepiece = tf_text.FastSentencepieceTokenizer(tokenizer_model)
        self._functions = {}
        self._piece_list = None  # the vocabulary's pieces (`_piece_strings`), read on first use

    # -- pieces ------------------------------------------------------------
    @not_converted
    def clean_text(self, text, max_tokens=None):
        """Input hygiene: invalid UTF-8 becomes U+FFFD, overlong text is cut (to what
        `max_tokens` pieces can hold, when given, instead of `max_length`).

        Args:
            text: string `[batch]`.

        Returns:
            string `[batch]`, valid UTF-8, at most `16 * max_length` characters.
        """
        text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace",
                                            replacement_char=0xFFFD)
        tokens = self.config.max_length if max_tokens is None else max_tokens + 1
        return tf.strings.substr(text, 0, CHARS_PER_TOKEN_BOUND * tokens, unit="UTF8_CHAR")

    @not_converted
    def encode_text(self, text, max_tokens=None):
        """Tokenizes and appends EOS, truncating to `max_length` tokens (`max_tokens` text
        tokens, then EOS, when given).

        Returns:
            source ids int32 `[batch, S]` padded with PAD_ID (S <= max_length),
            and the number of text tokens per input int32 `[batch]` (0 for
            empty or whitespace-only text).
        """
        tokens = self.sentencepiece.tokenize(text)  # ragged [batch, (n)]
        limit = self.config.max_length - 1 if max_tokens is None else max_tokens  # room for EOS
        lengths = tf.minimum(tf.cast(tokens.row_lengths(), tf.int32), limit)  # [batch]
        width = tf.reduce_max(tf.concat([lengths, [0]], axis=0))
        # Crop with to_tensor's shape, not ragged slicing (`tokens[:, :k]`
        # lowers to RaggedRange, which LiteRT lacks).
        dense = tf.cast(tokens.to_tensor(default_value=PAD_ID, shape=tf.stack([tf.shape(lengths)[0], width])),
                        tf.int32)  # [batch, width]
        dense = tf.pad(dense, [[0, 0], [0, 1]], constant_values=PAD_ID)  # [batch, width + 1]
        positions = tf.range(width + 1, dtype=tf.int32)  # [width + 1]
        # EOS right after each input's last token.
        return tf.where(tf.expand_dims(positions, 0) == tf.expand_dims(lengths, 1), EOS_ID, dense), lengths

    @not_converted
    def encode_conllu(self, conllu, strict=True):
        """CoNLL-U sentences -> source ids, lengths and the model's syntax features.

        Args:
            strict: True fails (InvalidArgumentError naming the problem) on
                a malformed sentence; False makes it an empty source and
                names the problem in `errors` (`annotated_features`).

        Returns:
            source ids int32 `[batch, S]` (pieces of each word, EOS, PAD;
            at most `max_length`), the number of pieces per input int32
            `[batch]`, the dict of the model's extra encoder inputs
            (`source_tags`, `source_distances`, as it needs), and each
            sentence's problem, string `[batch]` ("" when well-formed).
        """
        features = annotated_features(conllu, self.sentencepiece, self.config.max_length,
                                      self.config.source_tags, truncate=True, strict=strict)
        return (features["source_ids"], features["source_lengths"],
                {name: features[name] for name in source_feature_names(self.config)}, features["errors"])


    @not_converted
    def decode_ids(self, ids, static_batch=None):
        """ids int32 `[n, L]` (text tokens, then EOS and PAD) -> strings `[n]`.

        EOS, PAD and BOS are control pieces, which SentencePiece decodes to
        nothing, so the dense ids go to the detokenizer as they are.

        Args:
            static_batch: if set, the rows are padded to this many before
                detokenizing and the result is cut back to `n` (n must be
                <= static_batch). LiteRT's FastSentencepieceDetokenize kernel
                (tensorflow-text 2.20 and 2.21) never resizes its output, so
                with a dynamic batch its output claims the placeholder shape
                [1] while holding n strings, and reading it overflows memory;
                with a static batch the shape is right.
        """
        if static_batch is None:
            return self.sentencepiece.detokenize(ids)
        count = tf.shape(ids)[0]
        padded = tf.pad(ids, [[0, static_batch - count], [0, 0]], constant_values=PAD_ID)
        padded = tf.reshape(padded, [static_batch, self.searcher.max_decode_length])  # [static_batch, L]
        return self.sentencepiece.detokenize(padded)[:count]

    @not_converted
    def translate_graph(self, text, options, *, litert_batch=None, xla=False,
                        batch_halvings=XLA_BATCH_HALVINGS, target_prefix=None):
        """The whole translation as graph ops.

        Args:
            text: string `[batch]`, any bytes.
            options: the `SearchOptions` (`Searcher.search`): `beam_size` and
                `num_results` static python ints, or (plain graph, with
                `max_beam_size`, a python int) int32 scalars given at run time:
                one graph for every beam size up to `max_beam_size`; `alpha` a
                float scalar; `extra_length` an int scalar (clipped to
                `[0, decode_extra_length]`, the size the buffers were made for);
                `patience` None (exact search) or a float scalar (CTranslate2's
                patience stop; <= 0 is off); `exact_results` and a run-time beam
                size not with `xla` or `litert_batch`.
            litert_batch: None for the SavedModel graph. For the LiteRT
                variant, the largest batch (static): input hygiene is skipped
                (TFLite has no string ops: invalid UTF-8 then reaches the
                tokenizer, which maps it to unknown tokens, and long inputs
                are tokenized whole before the cut), the search is
                `Searcher.search_litert`'s and the detokenizer runs on a
                static batch (see `decode_ids`).
            xla: run the search XLA-compiled (`Searcher.search_xla`); the rest of the
                graph stays plain TensorFlow.
            batch_halvings: with `xla`, the search's `Halvings` (0: none).
            target_prefix: None, or string `[batch]`: the text each translation must start
                with (CTranslate2's `target_prefix`; "" for none), tokenized as the
                targets were in training and cut to `max_length - 1` pieces (`_prefix`). The
                translation returned includes it. Plain graph only (not `xla`, not
                `litert_batch`).
        Returns:
            translations string `[batch, num_results]`, scores float32
            `[batch, num_results]`. Empty or whitespace-only inputs give ""
            with score 0.

        A syntax-aware model reads `text` as CoNLL-U sentences
        (`translate_conllu_graph`, strict: a malformed sentence fails the
        call) and searches in the plain graph.
        """
        if not isinstance(options, SearchOptions):
            raise TypeError(f"translate_graph takes a SearchOptions, got {options!r}")
        if self.config.syntax_aware:
            if litert_batch is not None or xla:
                raise ValueError("a syntax-aware model translates CoNLL-U in the plain TensorFlow graph; "
                                 "its LiteRT and XLA variants are not built (plain-text models only)")
            strings, scores, _ = self.translate_conllu_graph(text, options, strict=True, target_prefix=target_prefix)
            return strings, scores
        if (xla or litert_batch is not None) and (options.exact_results is not None or
                                                  options.max_beam_size is not None):
            raise ValueError("exact_results and a run-time beam size are for the plain graph's search "
                             f"(translate_options); the {'XLA' if xla else 'LiteRT'} search's are python ints")
        if target_prefix is not None and (xla or litert_batch is not None):
            raise ValueError("target_prefix is searched in the plain TensorFlow graph; the XLA and LiteRT "
                             "searches take none")
        if litert_batch is None:
            text = self.clean_text(text)
        source_ids, lengths = self.encode_text(text)
        if target_prefix is not None:
            ids, scores = self.searcher.search(source_ids, lengths, options, target_prefix=self._prefix(target_prefix))
        elif xla:
            ids, scores = self.searcher.search_xla(source_ids, lengths, options, batch_halvings=batch_halvings)
        elif litert_batch is not None:
            ids, scores = self.searcher.search_litert(source_ids, lengths, options)
        else:
            ids, scores = self.searcher.search(source_ids, lengths, options)
        return self._strings(ids, scores, lengths, options.num_results, litert_batch)

    def _prefix(self, target_prefix):
        """`target_prefix` (string `[batch]`) as the search's `(ids [batch, P], lengths [batch])`:
        cleaned and tokenized as sources are (EOS after: never read)."""
        return self.encode_text(self.clean_text(target_prefix))

    @not_converted
    def translate_conllu_graph(self, conllu, options, *, strict=False, target_prefix=None):
        """`translate_graph` for a syntax-aware model, with each sentence's problem.

        Args:
            conllu: string `[batch]`, one CoNLL-U sentence each.
            options: the `SearchOptions`, as in `translate_graph`.
            strict: False (the served signatures): a malformed sentence
                (`annotated.sentence_errors`) is translated as an empty
                input ("" with score 0) and its problem returned, while the
                other sentences translate as they would alone; True fails
                the whole call (InvalidArgumentError naming the problem).
            target_prefix: None, or string `[batch]`, as in `translate_graph`.

        Returns:
            translations string `[batch, num_results]`, scores float32
            `[batch, num_results]`, errors string `[batch]` ("" for a
            well-formed sentence).
        """
        if not isinstance(options, SearchOptions):
            raise TypeError(f"translate_conllu_graph takes a SearchOptions, got {options!r}")
        source_ids, lengths, features, errors = self.encode_conllu(conllu, strict=strict)
        prefix = None if target_prefix is None else self._prefix(target_prefix)
        ids, scores = self.searcher.search(source_ids, lengths, options, source_features=features, target_prefix=prefix)
        strings, scores = self._strings(ids, scores, lengths, options.num_results, None)
        return strings, scores, errors

    @not_converted
    def score_graph(self, text, target):
        """Forced decoding as graph ops: how likely the model finds each `target` as the
        translation of its `text` (`keras_transformer.inference.scoring`).

        Args:
            text: string `[batch]`, the sources, cleaned and cut as `translate_graph` does
                (CoNLL-U sentences for a syntax-aware model; a malformed one fails the call).
            target: string `[batch]`, the translations to score, cleaned the same way and
                cut to `max_length - 1 + decode_extra_length` pieces, the longest the search
                makes (EOS follows them).

        Returns:
            `(score, tokens, token_scores)`: float32 `[batch]`, the target's log-probability
            (the sum of its token scores, EOS included: CTranslate2's `score_batch`
            figure; divided by `decoding.length_penalty(len(tokens), alpha)` it is the
            beam search's score of that translation); string `[batch, T + 1]`, each
            target's pieces and then the EOS piece, "" after; float32 `[batch, T + 1]`,
            the log-probability of each, 0 after.
        """
        source_ids, _, features, target_ids, lengths, pieces = self._forced_inputs(text, target)
        token_scores = score_tokens(self.model, source_ids, pieces, lengths, features)  # [batch, T + 1]
        return tf.reduce_sum(token_scores, axis=1), self._token_strings(target_ids, lengths), token_scores

    @not_converted
    def align_graph(self, text, target, layer=-1):
        """Alignments as graph ops: one decoder layer's attention over each given
        translation, heads averaged (`keras_transformer.inference.alignment`).

        Args:
            text: string `[batch]`, the sources (as `score_graph` reads them).
            target: string `[batch]`, their translations (e.g. `translate`'s).
            layer: the decoder layer (python int; -1: the last).

        Returns:
            `(source_tokens, target_tokens, attention)`: string `[batch, S]` (each source's
            pieces and its EOS piece, "" after), string `[batch, T + 1]` (the target's, then
            EOS), float32 `[batch, T + 1, S]` (row `t`: what target piece `t` attends to).
        """
        source_ids, source_lengths, features, target_ids, lengths, pieces = self._forced_inputs(text, target)
        attention = attention_alignments(self.model, source_ids, pieces, lengths, layer, features)
        return self._token_strings(source_ids, source_lengths), self._token_strings(target_ids, lengths), attention

    def align(self, texts, targets, layer=-1):
        """Aligns each translation with its source: a list of `AlignedTranslation`, one per
        pair, with the pieces, their attention (`align_graph`) and the word pairs
        (`alignment.word_alignments`)."""
        texts, targets = _string_pairs(texts, targets, "align")
        key = ("align", layer)
        if key not in self._functions:
            self._functions[key] = tf.function(lambda t, g: self.align_graph(t, g, layer), autograph=False,
                                               input_signature=[tf.TensorSpec([None], tf.string)] * 2)
        source_tokens, target_tokens, attention = (t.numpy() for t in self._functions[key](texts, targets))
        results = []
        for sources, targets_row, weights in zip(source_tokens, target_tokens, attention):
            source = [t.decode("utf-8") for t in sources if t]
            target = [t.decode("utf-8") for t in targets_row if t]
            matrix = weights[:len(target), :len(source)]
            results.append(AlignedTranslation(source, target, matrix.tolist(), word_alignments(source, target, matrix)))
        return results

    def _forced_inputs(self, text, target):
        """What forced decoding (`score_graph`, `align_graph`) reads: the sources as the
        search reads them (CoNLL-U for a syntax-aware model, a malformed one failing the call)
        and the targets (`_encode_target`): `(source_ids [batch, S], source_lengths,
        source_features or None, target_ids [batch, T + 1] (pieces, EOS, PAD), target_lengths,
        the pieces alone [batch, T])`."""
        if self.config.syntax_aware:
            source_ids, source_lengths, features, _ = self.encode_conllu(text, strict=True)
        else:
            source_ids, source_lengths = self.encode_text(self.clean_text(text))
            features = None
        target_ids, lengths = self._encode_target(target)  # [batch, T + 1]
        positions = tf.range(tf.shape(target_ids)[1], dtype=tf.int32)  # [T + 1]
        pieces = tf.where(tf.expand_dims(positions, 0) < tf.expand_dims(lengths, 1), target_ids,
                          PAD_ID)[:, :-1]  # [batch, T]: the pieces alone
        return source_ids, source_lengths, features, target_ids, lengths, pieces

    def _token_strings(self, ids, lengths):
        """ids `[batch, N]` (pieces, EOS, PAD) -> their pieces as strings, up to and
        including EOS (position `lengths`), "" after: string `[batch, N]`."""
        positions = tf.range(tf.shape(ids)[1], dtype=tf.int32)  # [N]
        return tf.where(tf.expand_dims(positions, 0) <= tf.expand_dims(lengths, 1),
                        tf.gather(self.pieces(), ids), "")  # [batch, N]

    def _encode_target(self, target):
        """A translation to score or align, as `encode_text` makes sources: cleaned, its
        pieces then EOS, cut to the longest translation the search makes
        (`max_length - 1 + decode_extra_length` pieces)."""
        longest = self.config.max_length - 1 + self.config.decode_extra_length
        return self.encode_text(self.clean_text(target, max_tokens=longest), max_tokens=longest)

    def _sequence_ids(self, name, sequences):
        """A sequences option (`name`, e.g. `suppress_sequences`) given as target pieces
        (CTranslate2's form) as ids; a `ValueError` naming a piece that is not in the target
        vocabulary (the unknown piece is: its id)."""
        if not isinstance(sequences, (list, tuple)) or not all(
                isinstance(sequence, (list, tuple)) and all(isinstance(piece, str) for piece in sequence)
                for sequence in sequences):
            raise ValueError(f"{name} must be a list of lists of target pieces (strings), got {sequences!r}")
        ids = {piece: i for i, piece in enumerate(self._piece_strings())}
        unknown = [piece for sequence in sequences for piece in sequence if piece not in ids]
        if unknown:
            raise ValueError(f"{name}: token {unknown[0]!r} is not in the target vocabulary")
        return tuple(tuple(ids[piece] for piece in sequence) for sequence in sequences)

    def pieces(self):
        """The target vocabulary's pieces in id order, string `[vocab]`: a constant of the graph
        that asks for them (FastSentencepieceTokenizer has no id-to-piece op)."""
        return tf.constant(self._piece_strings(), tf.string)

    def _piece_strings(self):
        """The vocabulary's pieces in id order, a python list read once from the model."""
        if self._piece_list is None:
            import sentencepiece

            processor = sentencepiece.SentencePieceProcessor(model_proto=self.sentencepiece_model)
            self._piece_list = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
        return self._piece_list

    def score(self, texts, targets):
        """Scores each target as the translation of its source (forced decoding); a list of
        `ScoredTranslation`, one per pair. Same figures as the SavedModel's `score`
        signature (`score_graph`)."""
        texts, targets = _string_pairs(texts, targets, "score")
        if "score" not in self._functions:
            self._functions["score"] = tf.function(self.score_graph, autograph=False, input_signature=[
                tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string)])
        scores, tokens, token_scores = (t.numpy() for t in self._functions["score"](texts, targets))
        results = []
        for score, row_tokens, row_scores in zip(scores, tokens, token_scores):
            count = sum(1 for token in row_tokens if token)
            results.append(ScoredTranslation(float(score), [t.decode("utf-8") for t in row_tokens[:count]],
                                             [float(v) for v in row_scores[:count]]))
        return results

    def _strings(self, ids, scores, lengths, num_results, litert_batch):
        """Search results -> (translations string `[batch, n]`, scores `[batch, n]`)."""
        # Empty inputs: all-PAD ids decode to "" (no `where` on strings, which
        # LiteRT lacks).
        empty = tf.expand_dims(lengths == 0, 1)  # [batch, 1]
        ids = tf.where(tf.expand_dims(empty, 2), PAD_ID, ids)  # [batch, n, L]
        scores = tf.where(empty, 0.0, scores)
        flat = tf.reshape(ids, [-1, tf.shape(ids)[2]])  # [batch * n, L]
        static = None if litert_batch is None else litert_batch * num_results
        strings = tf.reshape(self.decode_ids(flat, static), [-1, num_results])  # [batch, n]
        return strings, scores

    # -- eager convenience -----------------------------------------------
    def translate(self, texts, options: SearchOptions | None = None, *, xla=False, target_prefix=None,
                  **options_by_name):
        """Translates a list (or string tensor) of sentences; returns a list of str
        (or, with `num_results > 1`, a list of lists).

        Args:
            texts: the sentences (CoNLL-U ones for a syntax-aware model).
            options: None, or a `SearchOptions` of python values (`extra_length` None: the
                config's); not with `options_by_name`.
            xla: run the search XLA-compiled (see below).
            target_prefix: None, or one string per text ("" for none): the start each
                translation must have (CTranslate2's `target_prefix`: terminology,
                interactive completion); the translations returned include it (plain graph
                only).
            **options_by_name: the decoding options by their names in the options table
                (`keras_transformer.decoding.options.OPTIONS`; what each does:
                docs/reference/options.md), python values, each checked by its row; a name the
                table does not hold is a `TypeError`. Not given: the config's beam size (1 when
                sampling), alpha and extra length where the row has no default of its own
                (the export's own, as a served request gets), else the row's.

        By default the search runs as the SavedModel's `serving_default` does (the
        plain graph, which drops each sentence once it is done); `xla=True` runs
        it XLA-compiled (without the export's batch halvings:
        `IN_PROCESS_BATCH_HALVINGS`), which compiles a program for each (length,
        batch) bucket it meets: same translations. With XLA, train.py's final BLEU
        took 1.8-4.1x the time (docs/lab-notebook, "Training's BLEU in the plain
        graph"). A syntax-aware model takes CoNLL-U sentences and always runs the
        plain graph.

        The options that disallow or penalize tokens work as CTranslate2's options of their
        CTranslate2 names (the table's column); a sequences option takes lists of target
        pieces, as CTranslate2 does. Sampling (`sampling_topk` other than 1) draws each token
        at random, reproducibly for a `seed`, with one beam. The XLA search takes the options
        that `Searcher.search_xla` compiles; the others run in the plain graph."""
        xla = xla and not self.config.syntax_aware
        given = self._given_options(options, options_by_name)
        texts = _string_batch(texts)
        prefixes = () if target_prefix is None else (_string_batch(target_prefix),)
        if prefixes and (xla or prefixes[0].shape[0] != texts.shape[0]):
            raise ValueError("target_prefix takes one string per text ('' for none), searched in the plain graph "
                             f"(xla=False); got {prefixes[0].shape[0]} for {texts.shape[0]} texts, xla={xla}")
        alpha, searched = given.pop("alpha"), given  # (alpha: an input of the traced function)
        key = (bool(xla), bool(prefixes), *sorted(searched.items()))
        if key not in self._functions:
            self._functions[key] = tf.function(
                lambda t, a, *prefix: self.translate_graph(
                    t, SearchOptions(alpha=a, **searched), xla=xla, batch_halvings=IN_PROCESS_BATCH_HALVINGS,
                    target_prefix=prefix[0] if prefix else None),
                input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([], tf.float32),
                                 *[tf.TensorSpec([None], tf.string)] * len(prefixes)],
                autograph=False)  # see searcher.not_converted
        strings, _ = self._functions[key](texts, tf.constant(alpha, tf.float32), *prefixes)
        decoded = [[s.decode("utf-8") for s in row] for row in strings.numpy()]
        return [row[0] for row in decoded] if searched["num_results"] == 1 else decoded

    def _given_options(self, options, options_by_name) -> dict:
        """`translate`'s options as checked python values by name (`SearchOptions`' fields):
        those given, and those whose row has no default of its own (the config's; the beam size
        1 when sampling) or that `translate` reads (`num_results`). A `TypeError` for a name the
        options table does not hold, a `ValueError` naming a bad value (its row's words, then
        `SearchOptions`' for the options' relations)."""
        if options is not None:
            if options_by_name or not isinstance(options, SearchOptions):
                raise TypeError(f"translate takes a SearchOptions or the options by name, not both; got {options!r} "
                                f"and {sorted(options_by_name)}")
            options_by_name = {option.name: getattr(options, option.name) for option in decoding_options.OPTIONS
                               if getattr(options, option.name) is not None}
        unknown = sorted(set(options_by_name) - set(decoding_options.BY_NAME))
        if unknown:
            raise TypeError(f"translate() got unexpected keyword argument(s): {', '.join(unknown)} (the decoding "
                            f"options: {', '.join(decoding_options.BY_NAME)})")
        given = dict(options_by_name)
        for option in decoding_options.OPTIONS:
            if option.kind == "sequences" and options is None and given.get(option.name):
                given[option.name] = self._sequence_ids(option.name, given[option.name])  # (by name: pieces)
        # (`beam_size or ...` had searched `beam_size=0` with the config's beam.)
        if given.get("beam_size") is None and given.get("sampling_topk", 1) != 1:
            given["beam_size"] = 1  # (sampling draws one token a step)
        given.setdefault("num_results", decoding_options.BY_NAME["num_results"].default)
        for option in decoding_options.OPTIONS:
            if given.get(option.name) is None and option.config_field is not None:
                given[option.name] = option.given_default(self.config)  # (the export's own: the config's)
            problem = option.name in given and given[option.name] is not None and option.python_problem(
                given[option.name], tensors=False)
            if problem:  # (NaN alpha had scored every hypothesis NaN: every translation was "")
                raise ValueError(problem)
        checked = SearchOptions(**given)  # a ValueError names a bad relation between values
        return {name: getattr(checked, name) for name in given}


def _string_pairs(texts, targets, what):
    """`texts` and `targets` as `[batch]` string tensors of one length each (`_string_batch`);
    a `ValueError` saying `what` takes one target per source otherwise."""
    texts, targets = _string_batch(texts), _string_batch(targets)
    if texts.shape[0] != targets.shape[0]:
        raise ValueError(f"{what} takes one target per source, got {texts.shape[0]} sources and "
                         f"{targets.shape[0]} targets")
    return texts, targets


def _string_batch(texts):
    """`texts` (a list of str or bytes, or a 1-D string tensor) as a `[batch]` string tensor;
    a `TypeError` naming what was given otherwise (a lone string bound to the
    `tf.function`'s `[None]` signature as a deep TensorFlow error)."""
    if tf.is_tensor(texts):
        if texts.dtype != tf.string or texts.shape.rank != 1:
            raise TypeError(f"translate takes a 1-D string tensor, got {texts.dtype.name} of shape {texts.shape}")
        return texts
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"translate takes a list of sentences, got one {type(texts).__name__}: pass [{texts!r:.40}]")
    texts = list(texts)
    for index, text in enumerate(texts):
        if not isinstance(text, (str, bytes)):
            raise TypeError(f"translate takes a list of sentences (str or bytes); item {index} is "
                            f"{type(text).__name__} {text!r:.40}")
    return tf.constant(texts, tf.string, shape=[len(texts)])

