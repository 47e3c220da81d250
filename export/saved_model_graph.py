"""The SavedModel's TensorFlow side: the exported `tf.Module` (tokenizer, averaged model and
beam search behind each signature) and the warm-up requests written beside it.

`export.saved_model` is the command and the export procedure (versions, the staging
directory, the config file) and documents the signatures. It imports this module only when
it exports, so that its `--help` and flag errors answer without TensorFlow, and gives this
module's public names as its own on first use (`from export.saved_model import
TranslationModule`).
"""

from __future__ import annotations

import pathlib

from export.signatures import (ADVANCED_SIGNATURE, ALIGN_SIGNATURE, LITERT_MAX_BATCH, LITERT_SIGNATURE,
                               OPTIONS_SIGNATURE, SCORE_SIGNATURE, SERVING_DEFAULT, WARMUP_CONLLU,
                               WARMUP_SENTENCES, XLA_SIGNATURE, chosen_signatures)
from keras_transformer.config import TransformerConfig
from keras_transformer.constants import MAX_BEAM_SIZE, NEG_INF
from keras_transformer.decoding import SearchOptions
from keras_transformer.decoding.options import DTYPES as KIND_DTYPES
from keras_transformer.decoding.options import (BY_NAME, CONSTRAINTS, PIECE_SEPARATOR, SAMPLING, SEQUENCE_SEPARATOR,
                                                served_defaults, signature_options, tensor_problems)
from keras_transformer.inference.searcher import XLA_BATCH_BUCKETS
from keras_transformer.inference.translator import Translator

import tensorflow as tf

# The module attribute that holds each signature's `tf.function` (the names the exports have
# always had: a SavedModel's object graph names them).
FUNCTION_ATTRIBUTES = {SERVING_DEFAULT: "serve", OPTIONS_SIGNATURE: "serve_with_options", SCORE_SIGNATURE: "serve_score",
                       ALIGN_SIGNATURE: "serve_align", LITERT_SIGNATURE: "serve_litert", XLA_SIGNATURE: "serve_xla",
                       ADVANCED_SIGNATURE: "serve_advanced"}


class TranslationModule(tf.Module):
    """The exported `tf.Module`: tokenizer + averaged model + beam search.

    Args:
        model: the trained (averaged) `keras.Model` from `build_transformer`.
        config: its `TransformerConfig`.
        tokenizer_model: SentencePiece model bytes (`Tokenizer.model_bytes`).
    """

    def __init__(self, model, config: TransformerConfig, tokenizer_model: bytes, patience: float = 0.0,
                 signatures=None):
        super().__init__(name="translation_module")
        # The signatures to build (`export.signatures.chosen_signatures`: all of the model's kind
        # when None). Only these become `tf.function` attributes: saving traces every one.
        self._names = chosen_signatures(config, signatures)
        # Track the tf.Variables behind the Keras variables, not the Keras
        # model: a Keras 3 model held by a tf.Module saves its wrapper
        # variables, which the TF1 session loader (TF Serving,
        # saved_model_cli) never restores into the handles the functions
        # read (keras-team/keras#20095). This is what keras.export.ExportArchive
        # does as well.
        self.model_variables = [v.value for v in model.variables]
        # The output projection's matrix `[d_model, vocab]` (the transposed embeddings),
        # stored once here rather than transposed by every call before its search
        # (`Searcher(output_kernel=...)`; a single sentence through `translate_xla` took
        # 0.87-0.89x the time on the 10,000-piece preset, docs/lab-notebook serving speed
        # part 25; `serving_default` moved within the noise). It costs the
        # SavedModel a second copy of the embeddings (5.1 MB for that preset, 66 MB
        # for `base`); the LiteRT conversion folded this transpose into a constant anyway.
        self.output_kernel = tf.Variable(model.embedding.output_kernel(), trainable=False,
                                         name="output_kernel")
        self._translator = Translator(model, config, tokenizer_model,  # not trackable: not saved
                                      output_kernel=self.output_kernel)
        self._config = config
        # The default signatures' patience stop (None: the exact search).
        self._patience = float(patience) if patience and patience > 0 else None
        source = "conllu" if config.syntax_aware else "text"
        text, target = tf.TensorSpec([None], tf.string, name=source), tf.TensorSpec([None], tf.string, name="target")
        # Each signature: its function and input specs. An option is a scalar for the whole
        # request, or one value per sentence (`[batch]`, what TF Serving's server-side batching
        # needs: `_per_sentence`). A syntax-aware model's sources are CoNLL-U (`score` and
        # `align`: a malformed one fails the request); it has no LiteRT / XLA variants.
        specs = {
            SERVING_DEFAULT: (self._serve, [text]),
            OPTIONS_SIGNATURE: (self._serve_with_options, [text, *_option_specs(OPTIONS_SIGNATURE)]),
            SCORE_SIGNATURE: (self._serve_score, [text, target]),  # forced decoding
            ALIGN_SIGNATURE: (self._serve_align, [text, target]),
            LITERT_SIGNATURE: (self._serve_litert, [text]),
            XLA_SIGNATURE: (self._serve_xla, [text]),
            ADVANCED_SIGNATURE: (self._serve_advanced, [
                text, tf.TensorSpec(None, tf.string, name="target_prefix"), *_option_specs(ADVANCED_SIGNATURE)]),
        }
        # autograph=False: the search graph needs no autograph (`searcher.not_converted`).
        self._functions = {name: tf.function(specs[name][0], autograph=False, input_signature=specs[name][1])
                           for name in self._names}
        for name, function in self._functions.items():  # tracked attributes: the save traces each
            setattr(self, FUNCTION_ATTRIBUTES[name], function)

    def _default_options(self):
        """The `SearchOptions` of the signatures without options: the config's beam size,
        alpha and extra length, one result, the export's patience."""
        config = self._config
        return SearchOptions(beam_size=config.beam_size, alpha=config.length_penalty_alpha, num_results=1,
                             extra_length=config.decode_extra_length, patience=self._patience)

    def _serve(self, text):
        if self._config.syntax_aware:  # a malformed sentence: "" and its problem in its own row of `error`
            strings, scores, errors = self._translator.translate_conllu_graph(text, self._default_options())
            return {"translation": strings[:, 0], "score": scores[:, 0], "error": errors}
        strings, scores = self._translator.translate_graph(text, self._default_options())
        return {"translation": strings[:, 0], "score": scores[:, 0]}

    def _serve_litert(self, text):
        strings, scores = self._translator.translate_graph(text, self._default_options(),
                                                           litert_batch=LITERT_MAX_BATCH)
        return {"translation": strings[:, 0], "score": scores[:, 0]}

    def _serve_xla(self, text):
        strings, scores = self._translator.translate_graph(text, self._default_options(), xla=True)
        return {"translation": strings[:, 0], "score": scores[:, 0]}

    def _serve_score(self, text, target):
        """Forced decoding (`Translator.score_graph`): each target's log-probability as the
        translation of its text, and of each of its pieces."""
        with tf.control_dependencies([_one_target_per_source(SCORE_SIGNATURE, text, target)]):
            score, tokens, token_scores = self._translator.score_graph(text, target)
        return {"score": score, "tokens": tokens, "token_scores": token_scores}

    def _serve_align(self, text, target):
        """Alignments (`Translator.align_graph`): what each target piece attends to in its
        source, the last decoder layer's heads averaged."""
        with tf.control_dependencies([_one_target_per_source(ALIGN_SIGNATURE, text, target)]):
            source_tokens, target_tokens, attention = self._translator.align_graph(text, target)
        return {"source_tokens": source_tokens, "target_tokens": target_tokens, "attention": attention}

    def _serve_with_options(self, text, *options):
        """`translate_options`: `text` and the options the table gives it (`signature_options`),
        in its order; each clipped (`_search_columns`), then one search per distinct set."""
        batch = tf.shape(text)[0]
        given = dict(zip(_option_names(OPTIONS_SIGNATURE), options))
        requested = _requested_results(given)
        columns = _search_columns(self._config, batch, OPTIONS_SIGNATURE, given)

        def search_group(rows, options):
            options = dict(zip(columns, options))
            found, found_scores, found_errors = self._search_options(tf.gather_nd(text, rows), options)  # [n, beam] x2
            found, found_scores = _result_slots(found, found_scores, options["beam_size"], options["num_results"])
            return found, found_scores, found_errors if self._config.syntax_aware else tf.fill([tf.size(rows)], "")

        # One search per distinct set of options, on its sentences (a request's own scalars:
        # one search on all of them, the graph's only one; requests that TF Serving merged
        # with other options: one search each, as each would run alone).
        strings, scores, errors = _search_groups(batch, tuple(columns.values()), search_group)
        # The output's width: the most results a sentence asked for (a request's own scalar
        # `num_results`, also for an empty request).
        width = tf.reduce_max(tf.concat([columns["num_results"], requested, [1]], 0))
        outputs = {"translations": strings[:, :width], "scores": scores[:, :width]}
        if self._config.syntax_aware:
            outputs["errors"] = errors
        return outputs

    def _serve_advanced(self, text, target_prefix, *options):
        """`translate_options` with every decoding option (`decoding_options.OPTIONS`, in the
        table's order after `target_prefix`) and a target prefix: each sentence's options
        checked (a bad value: the sentence is not searched, its translation is "", and `errors`
        says which value), then one search per distinct set of options, as `translate_options`
        does: the beam search (run-time beam size, constraints, prefix) or, where
        `sampling_topk` is not 1, the sampling search (one beam)."""
        batch = tf.shape(text)[0]
        given = dict(zip(_option_names(ADVANCED_SIGNATURE), options))
        requested = _requested_results(given)
        columns = _search_columns(self._config, batch, ADVANCED_SIGNATURE, given)
        vocabulary = self._translator.pieces()  # string [V]
        errors = _advanced_errors(columns, vocabulary)  # [batch]: "" or what is wrong
        good = tf.equal(errors, "")
        # a sentence with a bad option: searched as an empty input with the defaults ("", score 0)
        text = tf.where(good, tf.reshape(text, [-1]), "")
        target_prefix = tf.where(good, _per_sentence(target_prefix, batch, "target_prefix", ADVANCED_SIGNATURE), "")
        defaults = served_defaults(ADVANCED_SIGNATURE, self._config, self._patience or 0.0)
        columns = {name: tf.where(good, value, defaults[name]) for name, value in columns.items()}
        # (a sequences option: the sentences' distinct strings, each sentence's as an int32 index, a group key)
        sequences = {}
        for name in _sequence_names(columns):
            sequences[name], columns[name] = tf.unique(columns[name], out_idx=tf.int32)

        def search_group(rows, options):
            options = dict(zip(columns, options))
            for name, distinct in sequences.items():
                options[name] = _sequence_ids(distinct[options[name]], vocabulary)
            found = tf.cond(
                tf.equal(options["sampling_topk"], 1),
                lambda: self._search_advanced(tf.gather_nd(text, rows), tf.gather_nd(target_prefix, rows), options),
                lambda: self._sample_advanced(tf.gather_nd(text, rows), tf.gather_nd(target_prefix, rows), options))
            # (a syntax-aware model's searches name each malformed CoNLL-U sentence)
            return found[0], found[1], found[2] if self._config.syntax_aware else tf.fill([tf.size(rows)], "")

        strings, scores, conllu_errors = _search_groups(batch, tuple(columns.values()), search_group)
        if self._config.syntax_aware:  # a sentence's bad option first, else its CoNLL-U problem ("" for none)
            errors = tf.where(good, conllu_errors, errors)
        width = tf.reduce_max(tf.concat([columns["num_results"], requested, [1]], 0))
        return {"translations": strings[:, :width], "scores": scores[:, :width], "errors": errors}

    def _search_advanced(self, text, prefix, options):
        """`translate_advanced`'s beam search on one group: `translate_options`' search with
        the constraints and the prefix, its results in `MAX_BEAM_SIZE` slots (and, for a
        syntax-aware model, each sentence's CoNLL-U problem)."""
        found, found_scores, errors = self._search_options(text, options, target_prefix=prefix)
        slots = _result_slots(found, found_scores, options["beam_size"], options["num_results"])
        return (*slots, errors) if self._config.syntax_aware else slots

    def _sample_advanced(self, text, prefix, options):
        """`translate_advanced`'s sampling search on one group: one beam, one result (and, for a
        syntax-aware model, each sentence's CoNLL-U problem)."""
        search = SearchOptions(beam_size=1, alpha=options["alpha"], num_results=1,
                               extra_length=options["extra_length"], **_constraints(options),
                               **{name: options[name] for name in SAMPLING})
        if self._config.syntax_aware:  # (a malformed sentence: "" and its problem, as the beam search)
            found, found_scores, errors = self._translator.translate_conllu_graph(text, search, target_prefix=prefix)
            return (*_result_slots(found, found_scores, 1, 1), errors)
        found, found_scores = self._translator.translate_graph(text, search, target_prefix=prefix)
        return _result_slots(found, found_scores, 1, 1)

    def _search_options(self, text, options, *, target_prefix=None):
        """`translate_options`' search for the beam size `options["beam_size"]` (an int32 scalar
        in `[1, MAX_BEAM_SIZE]`, given at run time: one graph for every beam size, with the
        translations of the search built for each): `beam` result slots (the signature
        cuts them to `num_results`), from a search that stops as soon as the
        `num_results` best are known. One requested result stops by the best finished
        hypothesis, as `serving_default` does, not by the worst of `beam` (the n-best's
        bound: 12 instead of 9 loop steps on the test's batch). `translate_advanced`'s
        beam search adds a `target_prefix` and the logits processors' options
        (`decoding_options.CONSTRAINTS`, those `options` holds).

        Returns:
            translations string `[batch, beam]`, scores float32 `[batch, beam]`,
            errors string (`[batch]` for a syntax-aware model, else `[0]`).
        """
        beam = options["beam_size"]
        search = SearchOptions(beam_size=beam, alpha=options["alpha"], num_results=beam,
                               extra_length=options["extra_length"],
                               exact_results=tf.minimum(options["num_results"], beam), patience=options["patience"],
                               max_beam_size=MAX_BEAM_SIZE, **_constraints(options))
        if self._config.syntax_aware:
            return self._translator.translate_conllu_graph(text, search, target_prefix=target_prefix)
        strings, scores = self._translator.translate_graph(text, search, target_prefix=target_prefix)
        return strings, scores, tf.zeros([0], tf.string)  # errors: not an output of a plain-text model

    def signatures(self):
        """`tf.saved_model.save`'s `signatures`: the `tf.function`s themselves, which the
        save traces once, inside its save context. A concrete function traced before
        the save (`get_concrete_function()` here) was traced a second time by the save
        for the module's own `tf.function` attributes (the save context is part of
        tf.function's cache key): every search graph twice in `saved_model.pb`, twice
        the tracing, and twice the functions to restore at every load (docs/lab-notebook,
        "Export and load time")."""
        return dict(self._functions)


def _one_target_per_source(signature, text, target):
    """The check that a `score` or `align` request pairs each text with one target."""
    return tf.debugging.assert_equal(tf.size(text), tf.size(target), message=(
        f"{signature}: text and target must hold as many sentences (one target per source)"))


# The signatures' input dtype of each kind of option (`keras_transformer.decoding.options.DTYPES`).
DTYPES = {kind: tf.as_dtype(name) for kind, name in KIND_DTYPES.items()}


def _option_specs(signature):
    """`signature`'s option inputs, in the table's order (`decoding_options.signature_options`):
    each a scalar or one value per sentence (`_per_sentence`)."""
    return [tf.TensorSpec(None, DTYPES[option.kind], name=option.name) for option in signature_options(signature)]


def _option_names(signature):
    """The names of `signature`'s option inputs, in the order its function takes them."""
    return [option.name for option in signature_options(signature)]


def _requested_results(given):
    """The request's own number of results (the first value of each of `given`'s beam size and
    results), clipped as the options are (`_clipped`): the output's width for a request without
    sentences (`[0, n]`)."""
    beam = _clipped(BY_NAME["beam_size"], tf.reshape(given["beam_size"], [-1])[:1], {}, None)
    return _clipped(BY_NAME["num_results"], tf.reshape(given["num_results"], [-1])[:1], {"beam_size": beam}, None)


def _search_columns(config, batch, signature, given):
    """The options `given` to `signature` (`{name: tensor}` in its inputs' order) as one value
    per sentence, `[batch]` each (`_per_sentence`), in that order, each clipped by its row's
    `clip` (`_clipped`): the beam size and number of results to `[1, MAX_BEAM_SIZE]` and
    `[1, beam_size]`; a NaN or infinite alpha the export's own (it scored every hypothesis NaN,
    or -inf, or 0, so every translation was "" with score -1e9); a NaN patience off (0), and one
    above MAX_PATIENCE (more hypotheses than any search finishes) that bound, so
    round(beam * patience) stays an int32. The other options as given (`_advanced_errors`
    checks them)."""
    columns = {name: _per_sentence(value, batch, name, signature) for name, value in given.items()}
    for name, value in columns.items():
        columns[name] = _clipped(BY_NAME[name], value, columns, config)
    return columns


def _clipped(option, value, columns, config):
    """The served `value` of `option` brought into range by its row's `Clip` (as given where the
    row has none); a bound named by an option is `columns`' (already clipped) value of it."""
    clip = option.clip
    if clip is None:
        return value
    low, high = (columns[bound] if isinstance(bound, str) else bound for bound in (clip.low, clip.high))
    clipped = value
    if low is not None and high is not None:
        clipped = tf.clip_by_value(value, low, high)
    elif high is not None:
        clipped = tf.minimum(value, high)
    elif low is not None:
        clipped = tf.maximum(value, low)
    if clip.nan is not None:
        clipped = tf.where(tf.math.is_nan(value), clip.nan, clipped)
    if clip.non_finite:
        clipped = tf.where(tf.math.is_finite(value), clipped, option.given_default(config))
    return clipped


def _advanced_errors(columns, vocabulary):
    """`translate_advanced`'s check of each sentence's options: string `[batch]`, "" or what
    is wrong (the first bad value, named with the range it must be in: each option's served
    range in `decoding_options.OPTIONS`, a sequences option's pieces in the vocabulary, then
    sampling's one beam)."""
    topk = columns["sampling_topk"]
    problems = (
        *tensor_problems(columns, tf.math.is_finite),
        *((tf.logical_not(_known_pieces(columns[name], vocabulary)), BY_NAME[name].served_message)
          for name in _sequence_names(columns)),
        (tf.logical_and(tf.not_equal(topk, 1), columns["beam_size"] > 1),
         "sampling (sampling_topk other than 1) draws one token a step: it needs beam_size 1"),
    )
    errors = tf.fill(tf.shape(topk), "")
    for bad, message in reversed(problems):  # the first problem of the list wins
        errors = tf.where(bad, f"{ADVANCED_SIGNATURE}: {message}", errors)
    return errors


def _sequence_names(columns):
    """The sequences options among `columns`' names (served as strings of pieces)."""
    return [name for name in columns if BY_NAME[name].kind == "sequences"]


def _constraints(options):
    """The group's logits processors' options (`decoding_options.CONSTRAINTS` that `options`
    holds; run-time scalars, a sequences option as `_sequence_ids`' pair) as `SearchOptions`
    fields."""
    return {name: options[name] for name in CONSTRAINTS if name in options}


def _split_sequences(text):
    """Served `suppress_sequences` strings `[n]` as their pieces, ragged `[n, (S), (M)]`:
    each line a sequence, its pieces separated by spaces (empty pieces and sequences dropped)."""
    pieces = tf.strings.split(tf.strings.split(text, SEQUENCE_SEPARATOR), PIECE_SEPARATOR)  # [n, (S), (M)]
    pieces = tf.ragged.boolean_mask(pieces, tf.not_equal(pieces, ""))
    return tf.ragged.boolean_mask(pieces, pieces.row_lengths(axis=2) > 0)


def _known_pieces(text, vocabulary):
    """Whether every piece of each served `suppress_sequences` string (`[batch]`) is one of
    the target `vocabulary`'s (string `[V]`): bool `[batch]`."""
    pieces = _split_sequences(text)  # [batch, (S), (M)]
    known = tf.reduce_any(tf.equal(pieces.flat_values[:, None], vocabulary[None, :]), axis=1)  # [N]
    return tf.reduce_all(pieces.with_flat_values(known), axis=[1, 2])  # [batch]


def _sequence_ids(text, vocabulary):
    """One served `suppress_sequences` string (known pieces) as `SearchOptions`' run-time pair:
    ids int32 `[S, M + 1]` (a column of 0 after: never empty) and lengths int32 `[S]`."""
    pieces = _split_sequences(tf.reshape(text, [1])).values  # [S, (M)]
    ids = tf.argmax(tf.cast(tf.equal(pieces.flat_values[:, None], vocabulary[None, :]), tf.int32), axis=1,
                    output_type=tf.int32)  # [N]
    padded = tf.pad(pieces.with_flat_values(ids).to_tensor(0), [[0, 0], [0, 1]])  # [S, M + 1]
    return padded, tf.cast(pieces.row_lengths(), tf.int32)


def _result_slots(found, found_scores, beam, results):
    """A search's `[n, beam]` results in `MAX_BEAM_SIZE` slots: the slots beyond the
    sentence's own results are "" and NEG_INF (the search's own empty slots), not the
    hypotheses its stop did not keep exact."""
    kept = tf.range(MAX_BEAM_SIZE) < results  # [MAX_BEAM_SIZE]
    pad = [[0, 0], [0, MAX_BEAM_SIZE - beam]]
    found = tf.where(kept, tf.pad(found, pad), "")
    found_scores = tf.where(kept, tf.pad(found_scores, pad, constant_values=NEG_INF), NEG_INF)
    return found, found_scores


def _search_groups(batch, columns, search_group):
    """One search per distinct set of options: `columns`, a tuple of `[batch]` int32, float32
    or bool options, grouped by their values (`UniqueV2` of their bits); `search_group(rows,
    options)` searches the sentences `rows` (int64 `[n, 1]`) with the group's `options` (a
    tuple of scalars, the columns' dtypes) and returns (strings `[n, MAX_BEAM_SIZE]`, scores
    `[n, MAX_BEAM_SIZE]`, errors `[n]`), which land in those rows of the outputs."""
    dtypes = [column.dtype for column in columns]
    keys = tf.stack([_as_int32(column) for column in columns], axis=1)  # [batch, K]
    options, group = tf.raw_ops.UniqueV2(x=keys, axis=[0])  # [groups, K], [batch]
    options = tf.reshape(options, [-1, len(columns)])  # (UniqueV2 leaves the second dimension unknown)
    strings = tf.fill([batch, MAX_BEAM_SIZE], "")
    scores = tf.fill([batch, MAX_BEAM_SIZE], tf.constant(NEG_INF, tf.float32))
    errors = tf.fill([batch], "")

    def body(index, strings, scores, errors):
        rows = tf.where(tf.equal(group, index))  # [n, 1]
        values = tuple(_from_int32(value, dtype) for value, dtype in zip(tf.unstack(options[index]), dtypes))
        found, found_scores, found_errors = search_group(rows, values)
        return (index + 1, tf.tensor_scatter_nd_update(strings, rows, found),
                tf.tensor_scatter_nd_update(scores, rows, found_scores),
                tf.tensor_scatter_nd_update(errors, rows, found_errors))

    _, strings, scores, errors = tf.while_loop(
        lambda index, *_: index < tf.shape(options)[0], body, (0, strings, scores, errors))
    return strings, scores, errors


def _as_int32(column):
    """An option column as int32 bits (a float's bitcast, a bool as 0 / 1): `UniqueV2` keys."""
    if column.dtype == tf.float32:
        return tf.bitcast(column, tf.int32)
    return tf.cast(column, tf.int32)


def _from_int32(value, dtype):
    """`_as_int32`'s inverse for one value."""
    if dtype == tf.float32:
        return tf.bitcast(value, tf.float32)
    return tf.cast(value, dtype)


def _per_sentence(value, batch, name, signature=OPTIONS_SIGNATURE):
    """A `translate_options` option as one value per sentence, `[batch]`: given as a scalar
    (the whole request's), or as `[batch]`, one value per sentence of `text`, which TF
    Serving's server-side batching needs (`--enable_batching` concatenates the requests
    it merges along the first dimension of every input, and refuses a scalar input:
    "Batching Run() input tensors must have at least one dimension",
    tensorflow_serving/batching/batching_util.h). Any other shape fails the request with
    a message naming the option."""
    rank = tf.rank(value)
    fits = tf.logical_or(tf.equal(rank, 0), tf.logical_and(tf.equal(rank, 1), tf.equal(tf.size(value), batch)))
    check = tf.debugging.Assert(fits, [f"{signature}: {name} must be a scalar or hold one value for each "
                                       "sentence of text; its shape:", tf.shape(value),
                                       "text's:", tf.reshape(batch, [1])])
    with tf.control_dependencies([check]):
        return tf.broadcast_to(value, [batch])



def options_warmup_inputs(config: TransformerConfig, patience: float = 0.0) -> dict:
    """The options of the `translate_options` warm-up request: the export's own defaults
    (so it translates as `serving_default` does), one result; scalars, which
    `write_warmup_requests` gives each sentence of the request."""
    advanced = advanced_warmup_inputs(config, patience)  # (the same values, with more options)
    return {option.name: advanced[option.name] for option in signature_options(OPTIONS_SIGNATURE)}


def advanced_warmup_inputs(config: TransformerConfig, patience: float = 0.0) -> dict:
    """The inputs of the `translate_advanced` warm-up request besides `text`: no prefix and
    the options that translate as `serving_default` does (`decoding_options.served_defaults`)."""
    defaults = served_defaults(ADVANCED_SIGNATURE, config, patience)
    return {"target_prefix": tf.constant(""),
            **{option.name: tf.constant(defaults[option.name], DTYPES[option.kind])
               for option in signature_options(ADVANCED_SIGNATURE)}}


def write_warmup_requests(directory: pathlib.Path, model_name: str = "translator",
                          xla_texts: list[str] | None = None, conllu: bool = False,
                          options: dict | None = None, advanced: dict | None = None) -> pathlib.Path:
    """Writes `assets.extra/tf_serving_warmup_requests` (PredictionLog TFRecords).

    Args:
        xla_texts: if given, also one `translate_xla` request per text and
            batch bucket (`XLA_BATCH_BUCKETS`): each compiles one program.
        conllu: the model is syntax-aware: its requests are CoNLL-U in `conllu`.
        options: if given, also one `translate_options` request with these
            options (`options_warmup_inputs`), each given once per sentence, so
            that a TF Serving started with `--enable_batching` runs it too (its
            batching refuses scalar inputs, and the server fails the load when
            a warm-up request fails). Its first call
            instantiates its search: 2.2 s in TF2 on the 2-vCPU AVX2 machine
            for the `multi30k` shape (25 s when it held one search per beam
            size; docs/lab-notebook, "Export and load time"). The server pays
            that at load, not a request.
        advanced: if given, also one `translate_advanced` request with these
            inputs (`advanced_warmup_inputs`), given once per sentence as well.
    """
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    path = directory / "assets.extra" / "tf_serving_warmup_requests"
    path.parent.mkdir(parents=True, exist_ok=True)
    texts = list(WARMUP_CONLLU if conllu else WARMUP_SENTENCES)
    requests = [(SERVING_DEFAULT, texts, {})]
    if options is not None:
        requests.append((OPTIONS_SIGNATURE, texts, options))
    if advanced is not None:
        requests.append((ADVANCED_SIGNATURE, texts, advanced))
    requests += [(XLA_SIGNATURE, [text] * batch, {}) for text in xla_texts or () for batch in XLA_BATCH_BUCKETS]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for signature, texts, scalars in requests:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature))
            request.inputs["conllu" if conllu else "text"].CopyFrom(tf.make_tensor_proto(texts, dtype=tf.string))
            for name, value in scalars.items():  # one value per sentence: TF Serving's batching refuses scalars
                request.inputs[name].CopyFrom(tf.make_tensor_proto(tf.fill([len(texts)], value)))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return path

