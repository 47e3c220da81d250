"""The assembled model: sizes, causality, padding, cached decoding, saving."""

import keras
import numpy as np
import pytest

from keras_transformer import IncrementalDecoder, TransformerConfig, build_transformer
from keras_transformer.constants import BOS_ID, PAD_ID

TINY = dict(vocab_size=50, num_layers=2, d_model=16, d_ff=32, num_heads=2, dropout=0.1)


def random_ids(rng, shape, vocab=50):
    return rng.integers(4, vocab, size=shape).astype("int32")


def expected_params(config):
    """Parameter count from the survey's per-module formulas."""
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    attention = 4 * d * d + 4 * d  # W^Q, W^K, W^V, W^O with biases
    ffn = 2 * d * f + d + f
    layer_norm = 2 * d
    encoder = config.num_layers * (attention + ffn + 2 * layer_norm)
    decoder = config.decoder_depth * (2 * attention + ffn + 3 * layer_norm)
    return v * d + encoder + decoder  # one shared embedding/projection matrix


@pytest.mark.parametrize("preset,paper_millions", [("base", 65), ("big", 213)])
def test_paper_sizes(preset, paper_millions):
    config = TransformerConfig.from_preset(preset, vocab_size=37000)
    params = build_transformer(config).count_params()
    assert params == expected_params(config)
    # base: 63.08M vs the paper's "65M"; big: 214.2M vs "213M". The paper does
    # not give its exact vocabulary size ("about 37000") nor say how it
    # rounded; the architecture formulas above are matched exactly, and the
    # totals are within 3% of Table 3.
    assert abs(params / 1e6 - paper_millions) / paper_millions < 0.03


def test_causal_no_leak_from_future_targets():
    rng = np.random.default_rng(0)
    model = build_transformer(TransformerConfig(**TINY))
    source = random_ids(rng, (2, 7))
    target = random_ids(rng, (2, 6))
    changed = target.copy()
    changed[:, 4:] = random_ids(rng, (2, 2))
    a = np.asarray(model([source, target]))
    b = np.asarray(model([source, changed]))
    np.testing.assert_allclose(a[:, :4], b[:, :4], atol=1e-6)
    assert np.abs(a[:, 4:] - b[:, 4:]).max() > 1e-3


def test_a_one_position_target_or_source_gives_the_longer_calls_logits_without_a_warning():
    """`model([source, [[BOS]]])`, the first step of a decoding loop written around the model,
    and a one-token source: the logits of the longer calls (the first target position of a
    longer target, causality; the source padded), and no Keras warning about a softmax over one
    value ("Did you mean to use a sigmoid instead?"), which every such call gave."""
    import warnings

    rng = np.random.default_rng(4)
    model = build_transformer(TransformerConfig(**TINY))
    source = random_ids(rng, (2, 5))
    target = random_ids(rng, (2, 4))
    target[:, 0] = BOS_ID
    one_token = random_ids(rng, (2, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = np.asarray(model([source, target[:, :1]]))
        from_one_token = np.asarray(model([one_token, target]))
    assert not [str(w.message) for w in caught if "softmax" in str(w.message)]
    np.testing.assert_allclose(first, np.asarray(model([source, target]))[:, :1], atol=1e-6)
    padded = np.concatenate([one_token, np.full((2, 4), PAD_ID, "int32")], axis=1)
    np.testing.assert_allclose(from_one_token, np.asarray(model([padded, target])), atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_source_padding_does_not_change_logits(norm_first):
    rng = np.random.default_rng(1)
    model = build_transformer(TransformerConfig(**TINY, norm_first=norm_first))
    source = random_ids(rng, (2, 5))
    target = random_ids(rng, (2, 4))
    padded = np.concatenate([source, np.full((2, 9), PAD_ID, "int32")], axis=1)
    np.testing.assert_allclose(np.asarray(model([source, target])),
                               np.asarray(model([padded, target])), atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_step_by_step_decoding_equals_full_pass(norm_first):
    rng = np.random.default_rng(2)
    config = TransformerConfig(**TINY, norm_first=norm_first)
    model = build_transformer(config)
    source = random_ids(rng, (3, 6))
    source[0, 4:] = PAD_ID  # a padded source in the batch
    target = np.concatenate([np.full((3, 1), BOS_ID, "int32"), random_ids(rng, (3, 7))], axis=1)
    full = np.asarray(model([source, target]))  # [3, 8, vocab]
    assert_cached_decoding_matches(IncrementalDecoder(model, config), source, target, full, buffer=12)


def assert_cached_decoding_matches(decoder, source, target, full, buffer):
    """Decodes `target` one position at a time with `buffer` cache slots; every step's
    logits must equal the full pass's `full` at that position."""
    encoder_output, source_mask = decoder.encode(source)
    cross = decoder.cross_attention_caches(encoder_output)
    caches = decoder.initial_self_attention_cache(source.shape[0], buffer)
    for t in range(target.shape[1]):
        logits, caches = decoder.decode(target[:, t:t + 1], t, caches, cross, source_mask)
        np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], atol=1e-5)


def test_deeper_encoder_shallower_decoder(tmp_path):
    """num_decoder_layers: 3 encoder layers and 1 decoder layer, with the parameters of
    that many blocks; cached decoding equals the full pass; the .keras file keeps it."""
    rng = np.random.default_rng(5)
    config = TransformerConfig(**{**TINY, "num_layers": 3}, num_decoder_layers=1)
    model = build_transformer(config)
    assert (len(model.encoder_layers), len(model.decoder_layers), config.decoder_depth) == (3, 1, 1)
    assert model.count_params() == expected_params(config)
    assert expected_params(config) < expected_params(TransformerConfig(**{**TINY, "num_layers": 3}))
    source = random_ids(rng, (2, 6))
    target = np.concatenate([np.full((2, 1), BOS_ID, "int32"), random_ids(rng, (2, 5))], axis=1)
    full = np.asarray(model([source, target]))
    assert_cached_decoding_matches(IncrementalDecoder(model, config), source, target, full, buffer=8)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert len(loaded.decoder_layers) == 1 and loaded.transformer_config == config
    np.testing.assert_allclose(np.asarray(loaded([source, target])), full, atol=1e-6)


def test_incremental_step_fn_repeats_sources_over_beams():
    rng = np.random.default_rng(3)
    config = TransformerConfig(**TINY)
    model = build_transformer(config)
    source = random_ids(rng, (2, 5))
    target = np.concatenate([np.full((2, 1), BOS_ID, "int32"), random_ids(rng, (2, 3))], axis=1)
    full = np.asarray(model([source, target]))
    decoder = IncrementalDecoder(model, config)
    step_fn = decoder.make_step_fn(source, beam_size=3)
    cache = [(np.repeat(k, 3, 0), np.repeat(v, 3, 0))
             for k, v in decoder.initial_self_attention_cache(2, 8)]
    for t in range(4):
        logits, cache = step_fn(np.repeat(target[:, t:t + 1], 3, axis=0), cache, t)
        np.testing.assert_allclose(np.asarray(logits).reshape(2, 3, -1),
                                   np.repeat(full[:, t][:, None], 3, axis=1), atol=1e-5)


def test_config_and_keras_file_round_trip(tmp_path):
    rng = np.random.default_rng(4)
    model = build_transformer(TransformerConfig(**TINY, norm_first=True))
    source, target = random_ids(rng, (2, 5)), random_ids(rng, (2, 4))
    want = np.asarray(model([source, target]))

    clone = keras.Model.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(np.asarray(clone([source, target])), want, atol=1e-6)

    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)  # safe_mode stays on
    np.testing.assert_allclose(np.asarray(loaded([source, target])), want, atol=1e-6)
    # The shared embedding is still one matrix after loading.
    assert len(loaded.get_layer("embedding").weights) == 1


def test_a_keras_file_with_arbitrary_code_is_refused(tmp_path):
    """Models are programs: `load_model` keeps safe_mode on, so a `.keras` file whose
    Lambda layer carries Python bytecode is refused instead of run (issue #19)."""
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Lambda(lambda x: x * 2.0)(inputs))
    path = tmp_path / "lambda.keras"
    model.save(path)
    with pytest.raises(ValueError, match="arbitrary code execution"):
        keras.saving.load_model(path)


def test_config_presets_and_validation():
    base = TransformerConfig.from_preset("base")
    assert (base.num_layers, base.d_model, base.d_ff, base.num_heads, base.head_size,
            base.dropout, base.label_smoothing, base.train_steps) == (6, 512, 2048, 8, 64, 0.1, 0.1, 100_000)
    big = TransformerConfig.from_preset("big")
    assert (big.d_model, big.d_ff, big.num_heads, big.head_size, big.dropout, big.train_steps,
            big.checkpoints_to_average) == (1024, 4096, 16, 64, 0.3, 300_000, 20)
    assert (base.beam_size, base.length_penalty_alpha, base.decode_extra_length, base.warmup_steps,
            base.checkpoints_to_average) == (4, 0.6, 50, 4000, 5)
    assert TransformerConfig.from_preset("tiny", d_model=64).d_model == 64
    with pytest.raises(ValueError, match="num_heads=3 does not divide d_model=128"):
        TransformerConfig.from_preset("tiny", num_heads=3)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        TransformerConfig.from_preset("huge")
    with pytest.raises(ValueError, match=r"unknown TransformerConfig field\(s\) \['widht'\]"):
        TransformerConfig.from_preset("tiny", widht=3)
    assert TransformerConfig.from_dict(base.to_dict()) == base


def test_loaded_keras_file_decodes_through_the_same_wiring(tmp_path):
    """A `.keras` file reloads as a `Transformer`, so cached decoding works on it
    and agrees with its own full pass (no layer-name lookups to go stale)."""
    from keras_transformer import Transformer

    rng = np.random.default_rng(5)
    config = TransformerConfig(**TINY)
    model = build_transformer(config)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, Transformer) and loaded.transformer_config == config
    source = random_ids(rng, (2, 5))
    target = np.concatenate([np.full((2, 1), BOS_ID, "int32"), random_ids(rng, (2, 3))], axis=1)
    full = np.asarray(model([source, target]))
    assert_cached_decoding_matches(IncrementalDecoder(loaded, config), source, target, full, buffer=6)
    # A plain functional model has no encode/decode: refused in one line.
    with pytest.raises(TypeError, match="needs a Transformer from build_transformer"):
        IncrementalDecoder(keras.Model.from_config(model.get_config()), config)


def test_growing_cache_and_per_sentence_cross_cache_match_the_full_pass():
    """Decoding with self-attention caches that grow by concatenation (no
    preallocated buffer, no causal mask) and cross-attention keys/values kept
    once per sentence for 3 beams each gives the full pass's logits at every
    position, and the caches hold exactly the positions decoded so far."""
    rng = np.random.default_rng(5)
    config = TransformerConfig(**TINY)
    model = build_transformer(config)
    source = random_ids(rng, (2, 6))
    source[1, 3:] = PAD_ID
    target = np.concatenate([np.full((2, 1), BOS_ID, "int32"), random_ids(rng, (2, 4))], axis=1)
    full = np.asarray(model([source, target]))  # [2, 5, vocab]
    decoder = IncrementalDecoder(model, config)
    static = decoder.static_cache(source)
    assert static["cross"][0][0].shape[0] == 2  # one row per sentence
    cache = [(np.repeat(k, 3, 0), np.repeat(v, 3, 0)) for k, v in decoder.initial_self_attention_cache(2, 0)]
    for t in range(target.shape[1]):
        logits, cache = decoder.step(np.repeat(target[:, t:t + 1], 3, axis=0), cache, t, static, grow=True)
        assert cache[0][0].shape == (6, config.num_heads, t + 1, config.head_size)
        np.testing.assert_allclose(np.asarray(logits).reshape(2, 3, -1),
                                   np.repeat(full[:, t][:, None], 3, axis=1), atol=1e-5)


def test_attention_layers_are_every_attention_of_the_model_and_fusing_them_keeps_the_logits():
    """`Transformer.attention_layers()` lists each MultiHeadAttention once (encoder self,
    decoder self and cross per layer), so `fuse_projections` set through it reaches every
    one: a fresh trace of the fused model gives the unfused logits."""
    import tensorflow as tf

    from keras_transformer.layers.attention import MultiHeadAttention

    config = TransformerConfig.from_preset("tiny", vocab_size=50, max_length=16, dropout=0.0)
    keras.utils.set_random_seed(3)
    model = build_transformer(config)
    found = model.attention_layers()
    every = [layer for layer in model._flatten_layers() if isinstance(layer, MultiHeadAttention)]
    assert len(found) == 3 * config.num_layers == len(every)
    assert {id(layer) for layer in found} == {id(layer) for layer in every}
    rng = np.random.default_rng(0)
    source = rng.integers(4, 50, (3, 7)).astype("int32")
    target = rng.integers(4, 50, (3, 5)).astype("int32")
    source[1, 4:] = PAD_ID
    want = tf.function(lambda s, t: model([s, t], training=False))(source, target).numpy()
    for attention in found:
        attention.fuse_projections = True
    got = tf.function(lambda s, t: model([s, t], training=False))(source, target).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
