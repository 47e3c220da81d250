"""What a run reports: sacreBLEU of a `Translator` on sentence pairs, and the
loss/BLEU curves of its `history.csv`."""

from __future__ import annotations

import logging
import pathlib

import tensorflow as tf

from keras_transformer import run_dir

log = logging.getLogger(__name__)


def compute_bleu(translator, pairs_ds, limit=None, beam_size=4, batch_size=64):
    """Detokenized sacreBLEU of `translator` on `(source, target)` string pairs.

    Returns the `sacrebleu.BLEUScore`, its signature, and the hypotheses. A batch that the
    device has no memory for is translated in halves (said once); a single sentence that
    does not fit raises `RunError` in one line.
    """
    ds = pairs_ds if limit is None else pairs_ds.take(limit)
    hypotheses, references, halved = [], [], []
    for sources, targets in ds.batch(batch_size):
        hypotheses.extend(_translate_in_parts_that_fit(translator, sources, beam_size, halved))
        references.extend(t.decode("utf-8") for t in targets.numpy())
    score, signature = corpus_bleu(hypotheses, references)
    return score, signature, hypotheses


def _translate_in_parts_that_fit(translator, sources, beam_size, halved) -> list[str]:
    """`translator.translate(sources, beam_size=...)`, or, where the device runs out of memory
    (`ResourceExhaustedError`: a GPU, a batch of long sentences at a wide beam), the same in
    halves, each halved again as needed; `halved` collects the sizes that did not fit (a
    warning at the first). Each sentence's search is its own, so the hypotheses are the
    whole batch's (the tests' translator checks it)."""
    try:
        return list(translator.translate(sources, beam_size=beam_size))
    except tf.errors.ResourceExhaustedError as error:
        count = int(tf.shape(sources)[0])
        what = out_of_memory_reason(error)
        if count == 1:
            raise run_dir.RunError(f"out of memory translating a single sentence with beam {beam_size} for BLEU "
                                   f"({what}): a smaller --beam-size fits") from None
        if not halved:
            log.warning("out of memory translating %d sentences with beam %d for BLEU (%s): translating them "
                        "in smaller batches", count, beam_size, what)
        halved.append(count)
        half = count // 2
        return (_translate_in_parts_that_fit(translator, sources[:half], beam_size, halved)
                + _translate_in_parts_that_fit(translator, sources[half:], beam_size, halved))


def out_of_memory_reason(error: tf.errors.ResourceExhaustedError) -> str:
    """TensorFlow's first line of `error` (at most 160 characters), for the one-line messages
    of a device out of memory: in the BLEU passes and in training (`training.run`)."""
    message = error.message.strip() if error.message else ""
    return message.splitlines()[0][:160] if message else "out of memory"


def corpus_bleu(hypotheses, references, lowercase=False):
    """sacreBLEU (its default 13a tokenization) of detokenized hypotheses against one
    reference each: the `sacrebleu.BLEUScore` and its signature string.

    The one BLEU of the project's reports (`train.py` and the benchmarks).
    """
    import sacrebleu

    # force: the hypotheses are SentencePiece's detokenized output by construction; without it
    # sacreBLEU warned "It looks like you forgot to detokenize your test data" about a young
    # model's "der der der ." (same score and signature either way).
    bleu = sacrebleu.metrics.BLEU(lowercase=lowercase, force=True)
    score = bleu.corpus_score(list(hypotheses), [list(references)])
    return score, str(bleu.get_signature())


def plot_curves(model_dir):
    """Writes `curves.png`: training/validation loss and validation BLEU per checkpoint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = run_dir.read_history(model_dir)
    if not rows:
        return None
    steps = [int(r["step"]) for r in rows]
    fig, (ax_loss, ax_bleu) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("loss", "train loss"), ("val_loss", "validation loss")):
        values = [(s, float(r[key])) for s, r in zip(steps, rows) if r.get(key)]
        if values:
            ax_loss.plot(*zip(*values), marker="o", label=label)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("label-smoothed cross-entropy")
    ax_loss.legend()
    values = [(s, float(r["bleu"])) for s, r in zip(steps, rows) if r.get("bleu")]
    if values:
        ax_bleu.plot(*zip(*values), marker="o", color="tab:green")
    ax_bleu.set_xlabel("step")
    ax_bleu.set_ylabel("validation BLEU (greedy, subset)")
    fig.suptitle(str(model_dir))
    fig.tight_layout()
    out = pathlib.Path(model_dir) / run_dir.CURVE_FILE
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
