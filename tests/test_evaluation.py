"""keras_transformer.training.evaluation: sacreBLEU of a translator."""

import logging

import pytest
import sacrebleu
import tensorflow as tf

from keras_transformer.training.evaluation import compute_bleu, corpus_bleu


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


def test_corpus_bleu_is_sacrebleus_cased_and_lowercased_without_its_warning(caplog):
    """The benchmarks' BLEU (`corpus_bleu`) is sacreBLEU's, lowercased on request, and quiet
    on hypotheses that look tokenized."""
    hypotheses = ["Der Mann sieht den Hund ."] * 120
    references = ["der Mann sieht den Hund."] * 120
    with caplog.at_level(logging.WARNING):
        cased, cased_signature = corpus_bleu(hypotheses, references)
        lowered, lowered_signature = corpus_bleu(iter(hypotheses), iter(references), lowercase=True)
    assert not [r for r in caplog.records if "detokenize" in r.getMessage()]
    assert cased.score == sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references]).score
    assert lowered.score == sacrebleu.metrics.BLEU(lowercase=True).corpus_score(hypotheses, [references]).score
    assert lowered.score == pytest.approx(100.0) and cased.score < 90  # only the case of "Der" differs
    assert "|case:lc|" in lowered_signature and "|case:mixed|" in cased_signature


def test_a_batch_the_device_has_no_memory_for_is_translated_in_halves(caplog):
    """train.py's BLEU (final and per checkpoint) on a GPU that runs out of memory for a
    batch (TensorFlow's ResourceExhaustedError, raised here by a translator that has room
    for 5 sentences) translates it in halves, each halved again as needed: the same
    hypotheses, in order, as with room for all, one warning. A single sentence that does
    not fit is one line naming the beam."""
    from keras_transformer.run_dir import RunError

    sources = [f"sentence {i}" for i in range(37)]
    references = [f"satz {i}" for i in range(37)]

    class Translator:
        def __init__(self, room):
            self.room, self.calls = room, []

        def translate(self, batch, beam_size):
            self.calls.append(len(batch))
            if len(batch) > self.room:
                raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[80,4,512]\n"
                                                                   "[[{{node x}}]]")
            return [s.decode().replace("sentence", "satz") + f" b{beam_size}" for s in batch.numpy()]

    pairs = tf.data.Dataset.from_tensor_slices((sources, references))
    roomy, tight = Translator(64), Translator(5)
    expected = compute_bleu(roomy, pairs, batch_size=16, beam_size=3)
    with caplog.at_level(logging.WARNING):
        score, signature, hypotheses = compute_bleu(tight, pairs, batch_size=16, beam_size=3)
    assert hypotheses == expected[2] == [f"satz {i} b3" for i in range(37)]
    assert (score.score, signature) == (expected[0].score, expected[1])
    assert roomy.calls == [16, 16, 5]
    assert tight.calls == [16, 8, 4, 4, 8, 4, 4, 16, 8, 4, 4, 8, 4, 4, 5]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["out of memory translating 16 sentences with beam 3 for BLEU (OOM when allocating tensor "
                        "with shape[80,4,512]): translating them in smaller batches"]
    with pytest.raises(RunError, match=r"^out of memory translating a single sentence with beam 3 for BLEU \(OOM "
                                       r"when allocating tensor with shape\[80,4,512\]\): a smaller --beam-size fits$"):
        compute_bleu(Translator(0), pairs, batch_size=16, beam_size=3)
