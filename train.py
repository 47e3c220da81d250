"""Train a Transformer, average its last checkpoints, report BLEU, export it.

    python train.py                                   # tiny model, embedded corpus, ~4 min on 2 cores
    python train.py --data ../shared/data/multi30k --config small --steps 20000 --model-dir runs/m30k

Flow: flags -> corpus -> shared SentencePiece tokenizer (trained once, kept in
the model directory) -> token-budget batches -> `model.fit` under
`tf.distribute.MirroredStrategy` (all visible GPUs; the default strategy on
one device) with checkpoints every `--checkpoint-every` steps -> average of
the last K checkpoints (paper: 5 for base) -> sacreBLEU on the validation set
with beam search -> SavedModel export.

Re-running the same command resumes from the newest complete checkpoint
(after Ctrl-C or kill -9 alike): weights, Adam moments and the step counter
that drives the learning-rate schedule continue where they were.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

log = logging.getLogger("train")

from keras_transformer.run_dir import (CHECKPOINT_DIR, CURVE_FILE, FINAL_WEIGHTS,  # noqa: E402
                                       HISTORY_FILE, RunError, check_run_file)

def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny",
                        help="model preset: tiny (default, CPU minutes), small, base or big (paper Table 3)")
    parser.add_argument("--data", default="embedded",
                        help="'embedded' (default: generated En->De corpus shipped with the package), "
                             "a directory of train.SRC/train.TGT, valid.*, test*.* text files, "
                             "or a TFDS name such as wmt14_translate/de-en or tfds:NAME")
    parser.add_argument("--source-lang", default=None, help="source language code (default en)")
    parser.add_argument("--target-lang", default=None, help="target language code (default de)")
    parser.add_argument("--model-dir", default="runs/default",
                        help="where the tokenizer, checkpoints, logs, curves and export go; "
                             "an existing run there is resumed")
    parser.add_argument("--steps", type=int, default=None,
                        help="total optimizer steps (default: 600 for tiny, else the preset's "
                             "train_steps, e.g. 100000 for base)")
    parser.add_argument("--batch-tokens", type=int, default=None,
                        help="padded tokens per side in one global batch (paper: 25000; "
                             "default 2048 for tiny, 4096 for small, 25000 otherwise)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="SentencePiece vocabulary size when a tokenizer is trained "
                             "(default: the preset's, 37000 for base/big as in the paper)")
    parser.add_argument("--max-length", type=int, default=None,
                        help="longest source/target in tokens; longer pairs are dropped and counted "
                             "(default: the preset's max_length)")
    parser.add_argument("--checkpoint-every", type=int, default=None,
                        help="steps between checkpoints (default: steps/10, at least 1)")
    parser.add_argument("--keep-checkpoints", type=int, default=None,
                        help="checkpoints kept on disk (default: the number averaged)")
    parser.add_argument("--average", type=int, default=None,
                        help="average the last K checkpoints into the final weights "
                             "(default: 5 for base/tiny/small, 20 for big, as in the paper)")
    parser.add_argument("--beam-size", type=int, default=None, help="beam for BLEU (default 4)")
    parser.add_argument("--bleu-every-sentences", type=int, default=100,
                        help="validation sentences translated greedily at every checkpoint for the "
                             "BLEU curve (0 disables)")
    parser.add_argument("--jit-compile", action="store_true",
                        help="compile the train step with XLA")
    parser.add_argument("--mixed-precision", action="store_true",
                        help="mixed_float16 on GPUs (with loss scaling), mixed_bfloat16 on CPU")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, shuffling and data")
    parser.add_argument("--no-export", action="store_true",
                        help="skip the SavedModel export at the end")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_tokens", "vocab_size", "max_length", "checkpoint_every",
                 "keep_checkpoints", "average", "beam_size"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    return args


def make_strategy():
    """MirroredStrategy over all visible GPUs; the default strategy on one device."""
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([gpu.name for gpu in gpus])
    return tf.distribute.get_strategy()


def _defaults(args, preset):
    tiny = args.config == "tiny"
    small = args.config == "small"
    steps = args.steps or (600 if tiny else preset.train_steps)
    average = args.average or preset.checkpoints_to_average
    return dict(
        steps=steps,
        batch_tokens=args.batch_tokens or (2048 if tiny else 4096 if small else 25000),
        checkpoint_every=args.checkpoint_every or max(1, steps // 10),
        average=average,
        keep=max(args.keep_checkpoints or average, average),
    )


def prepare_tokenizer(model_dir, corpus, vocab_size, seed):
    """Loads `model_dir/tokenizer.model`, or trains it on both sides of the training split."""
    from keras_transformer.data import Tokenizer, tokenizer_path, train_tokenizer

    path = tokenizer_path(model_dir)
    if not path.exists():
        log.info("training a %d-piece SentencePiece vocabulary on %s", vocab_size, corpus.name)
        train_tokenizer(corpus.texts("train"), path.with_suffix(""), vocab_size, seed=seed)
    return Tokenizer.load(path)


def compute_bleu(translator, pairs_ds, limit=None, beam_size=4, batch_size=64):
    """Detokenized sacreBLEU of `translator` on `(source, target)` string pairs.

    Returns the `sacrebleu.BLEUScore`, its signature, and the hypotheses.
    """
    import sacrebleu

    ds = pairs_ds if limit is None else pairs_ds.take(limit)
    hypotheses, references = [], []
    for sources, targets in ds.batch(batch_size):
        hypotheses.extend(translator.translate(sources, beam_size=beam_size))
        references.extend(t.decode("utf-8") for t in targets.numpy())
    bleu = sacrebleu.metrics.BLEU()
    score = bleu.corpus_score(hypotheses, [references])
    return score, str(bleu.get_signature()), hypotheses


def plot_curves(model_dir):
    """Writes `curves.png`: training/validation loss and validation BLEU per checkpoint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = pathlib.Path(model_dir) / HISTORY_FILE
    rows = list(csv.DictReader(path.open())) if path.exists() else []
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
    out = pathlib.Path(model_dir) / CURVE_FILE
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def train_and_evaluate(args) -> dict:
    """Runs the whole job for parsed `args`; returns the final figures."""
    from keras_transformer import (LabelSmoothedCrossEntropy, MaskedAccuracy, TransformerConfig,
                                   build_transformer, make_optimizer)
    from keras_transformer.checkpoints import CheckpointStore, average_checkpoints
    from keras_transformer.data import count_overlong, load_corpus, make_batches
    from export.translator import Translator

    started = time.time()
    model_dir = pathlib.Path(args.model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(args.seed)
    if args.mixed_precision:
        gpu = bool(tf.config.list_logical_devices("GPU"))
        keras.mixed_precision.set_global_policy("mixed_float16" if gpu else "mixed_bfloat16")

    preset = TransformerConfig.from_preset(args.config)
    plan = _defaults(args, preset)
    corpus = load_corpus(args.data, args.source_lang, args.target_lang, seed=args.seed)
    log.info("data %s (%s -> %s): %s", corpus.name, corpus.source_lang, corpus.target_lang,
             {k: v for k, v in corpus.sizes.items()})
    tokenizer = prepare_tokenizer(model_dir, corpus, args.vocab_size or preset.vocab_size, args.seed)
    overrides = {"vocab_size": tokenizer.vocab_size}
    if args.max_length:
        overrides["max_length"] = args.max_length
    config = TransformerConfig.from_preset(args.config, **overrides)
    data_args = {"data": corpus.name, "source_lang": corpus.source_lang, "target_lang": corpus.target_lang}
    check_run_file(model_dir, config, tokenizer, data_args)
    log.info("config %s: %s", args.config, config)
    log.info("training split: %s", count_overlong(corpus.splits["train"], tokenizer, config.max_length))

    strategy = make_strategy()
    replicas = strategy.num_replicas_in_sync
    train_ds = make_batches(corpus.splits["train"], tokenizer, batch_tokens=plan["batch_tokens"],
                            max_length=config.max_length, shuffle=True, seed=args.seed, repeat=True,
                            batch_multiple=replicas)
    valid_split = "valid" if "valid" in corpus.splits else None
    valid_ds = None
    if valid_split:
        valid_ds = make_batches(corpus.splits[valid_split], tokenizer, batch_tokens=plan["batch_tokens"],
                                max_length=config.max_length, batch_multiple=replicas).cache()

    with strategy.scope():
        model = build_transformer(config)
        model.compile(optimizer=make_optimizer(config),
                      loss=LabelSmoothedCrossEntropy(config.label_smoothing),
                      metrics=[MaskedAccuracy()], jit_compile=args.jit_compile)
        model.optimizer.build(model.trainable_variables)
    store = CheckpointStore(model_dir / CHECKPOINT_DIR, model, model.optimizer, tokenizer.sha256,
                            max_to_keep=plan["keep"])
    start_step = store.restore_latest()
    every = plan["checkpoint_every"]
    rounds = math.ceil(plan["steps"] / every)
    log.info("%d replica(s); %d steps in rounds of %d; resuming at step %d",
             replicas, plan["steps"], every, start_step)

    translator = Translator(model, config, tokenizer.model_bytes)
    callbacks = [
        CheckpointAndBleu(store, translator,
                          corpus.splits[valid_split] if valid_split else None,
                          args.bleu_every_sentences, model_dir / HISTORY_FILE),
        keras.callbacks.TensorBoard(log_dir=str(model_dir / "logs"), update_freq=max(1, every // 4)),
    ]
    if start_step < plan["steps"]:
        model.fit(train_ds, epochs=rounds, steps_per_epoch=every, initial_epoch=start_step // every,
                  validation_data=valid_ds, callbacks=callbacks, verbose=1 if sys.stdout.isatty() else 2)

    averaged = store.paths[-plan["average"]:]
    log.info("averaging %d checkpoint(s): %s", len(averaged), ", ".join(os.path.basename(p) for p in averaged))
    average_checkpoints(model, averaged)
    model.save_weights(model_dir / FINAL_WEIGHTS)

    results = {"steps": int(model.optimizer.iterations.numpy()), "averaged_checkpoints": len(averaged)}
    beam = args.beam_size or config.beam_size
    for split in [s for s in ("valid", "test") if s in corpus.splits]:
        score, signature, hyps = compute_bleu(translator, corpus.splits[split], beam_size=beam)
        results[f"{split}_bleu"] = round(score.score, 2)
        results["bleu_signature"] = signature
        (model_dir / f"{split}.hyp.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
        print(f"{split} BLEU (beam {beam}, averaged model) = {score.score:.2f}  [{signature}]", flush=True)
    plot_curves(model_dir)
    if not args.no_export:
        from export.saved_model import export_model

        results["export"] = str(export_model(model, config, tokenizer, model_dir / "export"))
        print(f"exported SavedModel to {results['export']}", flush=True)
    results["seconds"] = round(time.time() - started, 1)
    (model_dir / "results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results), flush=True)
    return results


class CheckpointAndBleu(keras.callbacks.Callback):
    """At the end of every round of steps: checkpoint, greedy BLEU on a
    validation subset, and one row of `history.csv` (for the curves)."""

    def __init__(self, store, translator, valid_pairs, bleu_sentences, history_path):
        super().__init__()
        self.store = store
        self.translator = translator
        self.valid_pairs = valid_pairs
        self.bleu_sentences = bleu_sentences
        self.history_path = pathlib.Path(history_path)

    def on_epoch_end(self, epoch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        path = self.store.save(step)
        row = {"step": step, "loss": "", "val_loss": "", "accuracy": "", "val_accuracy": "", "bleu": ""}
        for key in ("loss", "val_loss", "accuracy", "val_accuracy"):
            if logs and key in logs:
                row[key] = f"{float(logs[key]):.4f}"
        if self.valid_pairs is not None and self.bleu_sentences:
            score, _, _ = compute_bleu(self.translator, self.valid_pairs,
                                       limit=self.bleu_sentences, beam_size=1)
            row["bleu"] = f"{score.score:.2f}"
        new = not self.history_path.exists()
        with self.history_path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            if new:
                writer.writeheader()
            writer.writerow(row)
        print(f"\nstep {step}: checkpoint {os.path.basename(path)}"
              + (f", greedy BLEU on {self.bleu_sentences} valid sentences {row['bleu']}" if row["bleu"] else ""),
              flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    from keras_transformer.checkpoints import CheckpointError
    from keras_transformer.data import CorpusError, TokenizerError

    try:
        train_and_evaluate(args)
    except (RunError, CorpusError, TokenizerError, CheckpointError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
