"""keras_transformer.evaluation: sacreBLEU of a translator."""

import logging

import sacrebleu
import tensorflow as tf

from keras_transformer.evaluation import compute_bleu


def test_bleu_is_sacrebleus_and_does_not_warn_about_spm_output(caplog):
    """A barely trained model's detokenized output ("der der der .") made sacreBLEU log "It
    looks like you forgot to detokenize your test data" into train.py's output at every BLEU.
    The hypotheses are SentencePiece's detokenized text: scored with `force`, same score and
    signature as sacreBLEU's default, no warning."""
    sources = [f"sentence {i}" for i in range(240)]  # sacreBLEU warns from 100 lines ending " ."
    references = ["der Mann sieht den Hund.", "die Frau kauft ein Buch."] * 120

    class Stammerer:
        def translate(self, batch, beam_size):
            return ["der der der ." if i % 2 else "die Frau kauft ein Buch ." for i in range(len(batch))]

    pairs = tf.data.Dataset.from_tensor_slices((sources, references))
    with caplog.at_level(logging.WARNING):
        score, signature, hypotheses = compute_bleu(Stammerer(), pairs, batch_size=64)
    assert not [r for r in caplog.records if "detokenize" in r.getMessage()]
    default = sacrebleu.metrics.BLEU()  # (which warns on these hypotheses)
    assert score.score == default.corpus_score(hypotheses, [references]).score > 0
    assert signature == str(default.get_signature())
