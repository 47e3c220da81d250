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

from export.saved_model import (ALIGN_SIGNATURE, LITERT_MAX_BATCH, LITERT_SIGNATURE, MAX_PATIENCE, OPTIONS_SIGNATURE,
                                SCORE_SIGNATURE, SERVING_DEFAULT, WARMUP_CONLLU, WARMUP_SENTENCES,
                                XLA_SIGNATURE)
from keras_transformer.config import TransformerConfig
from keras_transformer.constants import MAX_BEAM_SIZE, NEG_INF
from keras_transformer.decoding import SearchOptions
from keras_transformer.searcher import XLA_BATCH_BUCKETS
from keras_transformer.translator import Translator

import tensorflow as tf


class TranslationModule(tf.Module):
    """The exported `tf.Module`: tokenizer + averaged model + beam search.

    Args:
        model: the trained (averaged) `keras.Model` from `build_transformer`.
        config: its `TransformerConfig`.
        tokenizer_model: SentencePiece model bytes (`Tokenizer.model_bytes`).
    """

    def __init__(self, model, config: TransformerConfig, tokenizer_model: bytes, patience: float = 0.0):
        super().__init__(name="translation_module")
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
        # autograph=False: the search graph needs no autograph (`searcher.not_converted`).
        self.serve = tf.function(self._serve, autograph=False, input_signature=[
            tf.TensorSpec([None], tf.string, name=source)])
        self.serve_with_options = tf.function(self._serve_with_options, autograph=False, input_signature=[
            tf.TensorSpec([None], tf.string, name=source),
            # Each option: a scalar for the whole request, or one value per sentence (`[batch]`,
            # what TF Serving's server-side batching needs: `_per_sentence`).
            tf.TensorSpec(None, tf.int32, name="beam_size"),
            tf.TensorSpec(None, tf.float32, name="alpha"),
            tf.TensorSpec(None, tf.int32, name="extra_length"),
            tf.TensorSpec(None, tf.int32, name="num_results"),
            tf.TensorSpec(None, tf.float32, name="patience"),
        ])
        if config.syntax_aware:  # CoNLL-U in: no LiteRT / XLA variants (saving traces every tf.function)
            return
        self.serve_litert = tf.function(self._serve_litert, autograph=False, input_signature=[
            tf.TensorSpec([None], tf.string, name="text")])
        self.serve_xla = tf.function(self._serve_xla, autograph=False, input_signature=[
            tf.TensorSpec([None], tf.string, name="text")])
        self.serve_score = tf.function(self._serve_score, autograph=False, input_signature=[
            tf.TensorSpec([None], tf.string, name="text"), tf.TensorSpec([None], tf.string, name="target")])
        self.serve_align = tf.function(self._serve_align, autograph=False, input_signature=[
            tf.TensorSpec([None], tf.string, name="text"), tf.TensorSpec([None], tf.string, name="target")])

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
        with tf.control_dependencies([_one_target_per_source("score", text, target)]):
            score, tokens, token_scores = self._translator.score_graph(text, target)
        return {"score": score, "tokens": tokens, "token_scores": token_scores}

    def _serve_align(self, text, target):
        """Alignments (`Translator.align_graph`): what each target piece attends to in its
        source, the last decoder layer's heads averaged."""
        with tf.control_dependencies([_one_target_per_source("align", text, target)]):
            source_tokens, target_tokens, attention = self._translator.align_graph(text, target)
        return {"source_tokens": source_tokens, "target_tokens": target_tokens, "attention": attention}

    def _serve_with_options(self, text, beam_size, alpha, extra_length, num_results, patience):
        def clipped(beam_size, num_results):
            beam_size = tf.clip_by_value(beam_size, 1, MAX_BEAM_SIZE)
            return beam_size, tf.clip_by_value(num_results, 1, beam_size)

        batch = tf.shape(text)[0]
        # the request's own number of results (its first value), clipped: the output's width
        # for a request without sentences, whose output is empty (`[0, n]`, as before)
        _, requested = clipped(tf.reshape(beam_size, [-1])[:1], tf.reshape(num_results, [-1])[:1])
        beam_size, alpha, extra_length, num_results, patience = (
            _per_sentence(value, batch, name) for value, name in (
                (beam_size, "beam_size"), (alpha, "alpha"), (extra_length, "extra_length"),
                (num_results, "num_results"), (patience, "patience")))  # [batch] each
        beam_size, num_results = clipped(beam_size, num_results)
        # A NaN or infinite alpha is the export's own: it scored every hypothesis NaN (or -inf,
        # or 0), so every translation was "" with score -1e9. A NaN patience is off (<= 0), and
        # one above MAX_PATIENCE (more hypotheses than any search finishes) is that bound, so
        # round(beam * patience) stays an int32.
        alpha = tf.where(tf.math.is_finite(alpha), alpha, self._config.length_penalty_alpha)
        patience = tf.where(tf.math.is_nan(patience), 0.0, tf.minimum(patience, MAX_PATIENCE))
        # One search per distinct set of options, on its sentences (a request's own scalars:
        # one search on all of them, the graph's only one; requests that TF Serving merged
        # with other options: one search each, as each would run alone).
        keys = tf.stack([beam_size, tf.bitcast(alpha, tf.int32), extra_length, num_results,
                         tf.bitcast(patience, tf.int32)], axis=1)  # [batch, 5]
        options, group = tf.raw_ops.UniqueV2(x=keys, axis=[0])  # [groups, 5], [batch]
        options = tf.reshape(options, [-1, 5])  # (UniqueV2 leaves the second dimension unknown)
        # The output's width: the most results a sentence asked for (a request's own scalar
        # `num_results`, also for an empty request).
        width = tf.reduce_max(tf.concat([num_results, requested, [1]], 0))
        strings = tf.fill([batch, MAX_BEAM_SIZE], "")
        scores = tf.fill([batch, MAX_BEAM_SIZE], tf.constant(NEG_INF, tf.float32))
        errors = tf.fill([batch], "")

        def search_group(index, strings, scores, errors):
            rows = tf.where(tf.equal(group, index))  # [n, 1]
            beam, alpha, extra, results, patience = tf.unstack(options[index])
            found, found_scores, found_errors = self._search_options(
                tf.gather_nd(text, rows), beam, tf.bitcast(alpha, tf.float32), extra, results,
                tf.bitcast(patience, tf.float32))  # [n, beam] x2
            # the slots beyond the sentence's own results are "" and NEG_INF (the search's own
            # empty slots), not the hypotheses its stop did not keep exact
            kept = tf.range(MAX_BEAM_SIZE) < results  # [MAX_BEAM_SIZE]
            pad = [[0, 0], [0, MAX_BEAM_SIZE - beam]]
            found = tf.where(kept, tf.pad(found, pad), "")
            found_scores = tf.where(kept, tf.pad(found_scores, pad, constant_values=NEG_INF), NEG_INF)
            strings = tf.tensor_scatter_nd_update(strings, rows, found)
            scores = tf.tensor_scatter_nd_update(scores, rows, found_scores)
            if self._config.syntax_aware:
                errors = tf.tensor_scatter_nd_update(errors, rows, found_errors)
            return index + 1, strings, scores, errors

        _, strings, scores, errors = tf.while_loop(
            lambda index, *_: index < tf.shape(options)[0], search_group, (0, strings, scores, errors))
        outputs = {"translations": strings[:, :width], "scores": scores[:, :width]}
        if self._config.syntax_aware:
            outputs["errors"] = errors
        return outputs

    def _search_options(self, text, beam, alpha, extra_length, num_results, patience):
        """`translate_options`' search for the beam size `beam` (an int32 scalar in
        `[1, MAX_BEAM_SIZE]`, given at run time: one graph for every beam size, with the
        translations of the search built for each): `beam` result slots (the signature
        cuts them to `num_results`), from a search that stops as soon as the
        `num_results` best are known. One requested result stops by the best finished
        hypothesis, as `serving_default` does, not by the worst of `beam` (the n-best's
        bound: 12 instead of 9 loop steps on the test's batch).

        Returns:
            translations string `[batch, beam]`, scores float32 `[batch, beam]`,
            errors string (`[batch]` for a syntax-aware model, else `[0]`).
        """
        options = SearchOptions(beam_size=beam, alpha=alpha, num_results=beam, extra_length=extra_length,
                                exact_results=tf.minimum(num_results, beam), patience=patience,
                                max_beam_size=MAX_BEAM_SIZE)
        if self._config.syntax_aware:
            return self._translator.translate_conllu_graph(text, options)
        strings, scores = self._translator.translate_graph(text, options)
        return strings, scores, tf.zeros([0], tf.string)  # errors: not an output of a plain-text model

    def signatures(self):
        """`tf.saved_model.save`'s `signatures`: the `tf.function`s themselves, which the
        save traces once, inside its save context. A concrete function traced before
        the save (`get_concrete_function()` here) was traced a second time by the save
        for the module's own `tf.function` attributes (the save context is part of
        tf.function's cache key): every search graph twice in `saved_model.pb`, twice
        the tracing, and twice the functions to restore at every load (docs/lab-notebook,
        "Export and load time")."""
        if self._config.syntax_aware:  # CoNLL-U in; no LiteRT / XLA variants
            return {SERVING_DEFAULT: self.serve, OPTIONS_SIGNATURE: self.serve_with_options}
        return {SERVING_DEFAULT: self.serve, OPTIONS_SIGNATURE: self.serve_with_options,
                LITERT_SIGNATURE: self.serve_litert, XLA_SIGNATURE: self.serve_xla, SCORE_SIGNATURE: self.serve_score,
                ALIGN_SIGNATURE: self.serve_align}


def _one_target_per_source(signature, text, target):
    """The check that a `score` or `align` request pairs each text with one target."""
    return tf.debugging.assert_equal(tf.size(text), tf.size(target), message=(
        f"{signature}: text and target must hold as many sentences (one target per source)"))


def _per_sentence(value, batch, name):
    """A `translate_options` option as one value per sentence, `[batch]`: given as a scalar
    (the whole request's), or as `[batch]`, one value per sentence of `text`, which TF
    Serving's server-side batching needs (`--enable_batching` concatenates the requests
    it merges along the first dimension of every input, and refuses a scalar input:
    "Batching Run() input tensors must have at least one dimension",
    tensorflow_serving/batching/batching_util.h). Any other shape fails the request with
    a message naming the option."""
    rank = tf.rank(value)
    fits = tf.logical_or(tf.equal(rank, 0), tf.logical_and(tf.equal(rank, 1), tf.equal(tf.size(value), batch)))
    check = tf.debugging.Assert(fits, [f"translate_options: {name} must be a scalar or hold one value for each "
                                       "sentence of text; its shape:", tf.shape(value),
                                       "text's:", tf.reshape(batch, [1])])
    with tf.control_dependencies([check]):
        return tf.broadcast_to(value, [batch])



def options_warmup_inputs(config: TransformerConfig, patience: float = 0.0) -> dict:
    """The options of the `translate_options` warm-up request: the export's own defaults
    (so it translates as `serving_default` does), one result; scalars, which
    `write_warmup_requests` gives each sentence of the request."""
    return {"beam_size": tf.constant(config.beam_size, tf.int32),
            "alpha": tf.constant(config.length_penalty_alpha, tf.float32),
            "extra_length": tf.constant(config.decode_extra_length, tf.int32),
            "num_results": tf.constant(1, tf.int32),
            "patience": tf.constant(patience, tf.float32)}


def write_warmup_requests(directory: pathlib.Path, model_name: str = "translator",
                          xla_texts: list[str] | None = None, conllu: bool = False,
                          options: dict | None = None) -> pathlib.Path:
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
    """
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    path = directory / "assets.extra" / "tf_serving_warmup_requests"
    path.parent.mkdir(parents=True, exist_ok=True)
    texts = list(WARMUP_CONLLU if conllu else WARMUP_SENTENCES)
    requests = [(SERVING_DEFAULT, texts, {})]
    if options is not None:
        requests.append((OPTIONS_SIGNATURE, texts, options))
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

