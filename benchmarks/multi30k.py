"""Multi30k En->De quality for a wall-clock budget: the `multi30k` recipe end to end.

    python -m benchmarks.multi30k --minutes 56 --model-dir runs/multi30k-60min

What it does, as a user would:

1. `python train.py --config multi30k --data ../shared/data/multi30k
   [--max-minutes N] --model-dir D` (a subprocess): the recipe preset trains
   until the budget (`--minutes`, else the preset's own: `multi30k`'s 56
   minutes, none for `multi30k-literature`; stopping at a checkpoint
   boundary), averages the last
   checkpoints (the preset's 10), scores valid/test2016 and exports the SavedModel to
   `D/export/<version>`. A model directory holding a finished run
   (`results.json`) is evaluated again without training, never trained
   further; if its own export failed, the newest one in `D/export` is used
   (or the script stops, naming the command that makes one).
2. Loads that export (`tf.saved_model.load`, the `serving_default` signature,
   as `python -m export.translate` calls it: the run's own decoding, e.g. the
   preset's beam 5 and alpha 1.0, +50) and translates test2016.en in batches
   of 64. (Until 2026-12-02 it called `translate_xla`, the same translations,
   whose compile of each bucket cost more than its search saved on one file:
   docs/lab-notebook, "The translate command without XLA".)
3. Prints cased sacreBLEU on the raw references (the project's figure),
   lowercased (`-lc`), each with its signature, and lowercased
   Moses-tokenized BLEU (`benchmarks.literature_bleu`: how the Multi30k
   literature reports it; with `--tokenized`, on a model trained on the
   literature's own text, `benchmarks.multi30k_lc_tok`, its output as it is), and
   writes `D/bleu_minutes.png`: the greedy BLEU on
   100 validation sentences at every checkpoint against minutes of
   training, with the final test2016 BLEU.

4. With `--patience 1,2`: translates valid and test2016 again with the
   export's `translate_options` (plain graph) for each patience and for 0
   (our exact search) and prints a table of cased BLEU, how many
   translations equal the exact search's, and seconds; with the export's
   own beam and alpha (its `assets.extra` config), or `--patience-beam`.

The last line is `test2016_bleu: X` (cased). The data is read from
`../shared/data/multi30k` at run time and never copied into the repository.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

from benchmarks import harness
from benchmarks.literature_bleu import MOSES_MISSING, have_moses, lc_tok_bleu

REPO_ROOT = harness.REPO_ROOT
DEFAULT_DATA = harness.SHARED_DATA / "multi30k"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=None,
                        help="training budget in minutes (default: the preset's own: the multi30k preset's 56, "
                             "with which averaging, BLEU and export make the whole run about an hour; none for "
                             "multi30k-literature, which trains its 8,000 updates)")
    parser.add_argument("--model-dir", required=True, help="the run directory (resumed if it exists)")
    parser.add_argument("--data", default=str(DEFAULT_DATA),
                        help="a directory with train/valid/test2016 .en/.de files (default: the shared Multi30k)")
    parser.add_argument("--config", default="multi30k", help="train.py preset (default: the multi30k recipe)")
    parser.add_argument("--test", default="test2016", help="test file stem in --data (default test2016)")
    parser.add_argument("--patience", default="",
                        help="comma-separated patience values (e.g. 1,2): also translate valid and the test file "
                             "with translate_options at each and at 0 (the exact search) and print their BLEU "
                             "(CTranslate2's stopping rule against ours)")
    parser.add_argument("--patience-beam", type=int, default=0,
                        help="beam of the --patience table (default 0: the export's own, e.g. the preset's 5; "
                             "4 is the beam benchmarks.translate_speed compares engines on)")
    parser.add_argument("--tokenized", action="store_true",
                        help="--data holds the literature's lowercased Moses-tokenized text "
                             "(benchmarks.multi30k_lc_tok) and the model was trained on it: its output is scored "
                             "as it is by the literature's metric")
    parser.add_argument("--train-args", default="",
                        help="extra train.py flags, e.g. '--steps 20 --checkpoint-every 10' (smoke tests)")
    args = parser.parse_args(argv)
    try:
        args.patience = [float(p) for p in args.patience.split(",") if p.strip()]
    except ValueError:
        parser.error(f"--patience takes comma-separated numbers, got {args.patience!r}")
    if args.patience_beam < 0:
        parser.error("--patience-beam must be >= 0 (0: the export's own beam)")
    if any(p <= 0 for p in args.patience):
        parser.error("--patience values must be > 0 (0, the exact search, is always included)")
    if args.minutes is not None and args.minutes <= 0:
        parser.error("--minutes must be > 0")
    for lang in ("en", "de"):
        if not (pathlib.Path(args.data) / f"{args.test}.{lang}").exists():
            parser.error(f"--data {args.data} has no {args.test}.{lang}")
    return args


def train(args):
    """Runs train.py, or when the run directory holds a finished run (`results.json`) returns
    its results: with its export, or the newest in `MODEL_DIR/export` when its own export
    failed; without any export it stops with the command that makes one."""
    model_dir = pathlib.Path(args.model_dir)
    results_path = model_dir / "results.json"
    if results_path.exists():  # a finished run: never trained again (that would start a second budget)
        results = json.loads(results_path.read_text())
        if "export" not in results:  # its export failed; one made since is in EXPORT_DIR
            exports = sorted((int(p.parent.name), p.parent) for p in (model_dir / "export").glob("*/saved_model.pb")
                             if p.parent.name.isdigit())
            if not exports:
                sys.exit(f"multi30k: {model_dir} holds a finished run without an export (results.json has no "
                         f"'export'): make one with `python -m export.saved_model --model-dir {model_dir} "
                         f"--output {model_dir / 'export'}` and run this again")
            results["export"] = str(exports[-1][1])
        print(f"# {model_dir} holds a finished run: evaluating it without training", flush=True)
        return results
    command = [sys.executable, "train.py", "--config", args.config, "--data", args.data,
               "--model-dir", str(model_dir), *(["--max-minutes", f"{args.minutes:g}"] if args.minutes else []),
               *args.train_args.split()]
    print("# " + " ".join(command), flush=True)
    started = time.time()
    result = subprocess.run(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    for line in result.stdout.splitlines():
        print(f"#   {line}")
    if result.returncode != 0:
        sys.exit(f"multi30k: train.py failed with exit code {result.returncode}")
    print(f"# train.py took {(time.time() - started) / 60:.1f} min (training, averaging, BLEU, export)", flush=True)
    return json.loads(results_path.read_text())


# The export's signature that translates the test file: what `export.translate` calls by default.
SIGNATURE = "serving_default"


def translate(export, sources, batch_size=64):
    import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the tokenizer ops)

    from keras_transformer.console import harmless_lines_dropped

    signature = tf.saved_model.load(str(export)).signatures[SIGNATURE]
    hypotheses = []
    # (TensorFlow's error-level lines that ask nothing of the user, as `export.translate` drops
    # them: oneDNN's int32 fallback, logged by a Multi30k model's search on the Zen 4 too)
    with harmless_lines_dropped():
        for i in range(0, len(sources), batch_size):
            out = signature(text=tf.constant(sources[i:i + batch_size]))["translation"].numpy()
            hypotheses.extend(t.decode("utf-8") for t in out)
    return hypotheses


def decoding_options(export, beam_size=0):
    """`(beam, alpha, extra_length)` the export was built with (`beam_size` > 0 replaces
    its beam); the paper's (`TransformerConfig`'s defaults) for an export older than its
    config file."""
    from export.saved_model import read_export_config
    from keras_transformer import TransformerConfig

    record = read_export_config(export)
    config = TransformerConfig() if record is None else record[0]
    return beam_size or config.beam_size, config.length_penalty_alpha, config.decode_extra_length


def patience_table(export, data, splits, values, decoding, batch_size=64):
    """Cased BLEU of the export's `translate_options` with `decoding` (`decoding_options`)
    on each split for patience 0 (exact) and each of `values`: the table's lines."""
    import keras_transformer  # noqa: F401  (first: the quiet TensorFlow import)
    from keras_transformer.training.evaluation import corpus_bleu
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the tokenizer ops)

    from keras_transformer.console import harmless_lines_dropped

    options = tf.saved_model.load(str(export)).signatures["translate_options"]
    beam, alpha, extra = decoding

    def translate(sources, patience):
        out = []
        with harmless_lines_dropped():  # (as `translate` above: the same plain-graph search)
            for i in range(0, len(sources), batch_size):
                result = options(text=tf.constant(sources[i:i + batch_size]), beam_size=tf.constant(beam),
                                 alpha=tf.constant(alpha, tf.float32), extra_length=tf.constant(extra),
                                 num_results=tf.constant(1),
                                 patience=tf.constant(patience, tf.float32))
                out.extend(t.decode("utf-8") for t in result["translations"].numpy()[:, 0])
        return out

    header = " | ".join(f"{split} BLEU | {split} = exact | {split} s" for split in splits)
    lines = [f"| patience | {header} |", "|---" * (1 + 3 * len(splits)) + "|"]
    texts = {split: [harness.read_lines(data / f"{split}.{lang}") for lang in ("en", "de")]
             for split in splits}
    exact = {}
    for patience in [0.0, *values]:
        cells = []
        for split in splits:
            sources, references = texts[split]
            started = time.time()
            hypotheses = translate(sources, patience)
            seconds = time.time() - started
            exact.setdefault(split, hypotheses)
            same = sum(a == b for a, b in zip(hypotheses, exact[split]))
            bleu = corpus_bleu(hypotheses, references)[0].score
            cells.append(f"{bleu:.2f} | {same}/{len(sources)} | {seconds:.1f}")
        lines.append(f"| {patience:g}{' (exact)' if patience == 0 else ''} | {' | '.join(cells)} |")
    return lines


def literature_line(split, hypotheses, references, tokenized=False) -> str:
    """The output line with the literature's metric (`lc_tok_bleu`), or, where `sacremoses`
    is missing and the text needs its pipeline, the line saying so: the run's own figures,
    printed before it, stand without it."""
    if tokenized or have_moses():
        score = lc_tok_bleu(hypotheses, references, "de", tokenized=tokenized).score
        return f"# {split} lowercased Moses-tokenized BLEU (multi-bleu.perl, the literature's) {score:.2f}"
    return f"# {split} lowercased Moses-tokenized BLEU (the literature's): not computed: {MOSES_MISSING}"


def plot(model_dir, test_bleu, minutes):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from keras_transformer.run_dir import read_history

    rows = [r for r in read_history(model_dir) if r.get("minutes") and r.get("bleu")]
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.plot([float(r["minutes"]) for r in rows], [float(r["bleu"]) for r in rows], "o-",
              label="greedy BLEU, 100 valid sentences (checkpoint)")
    axis.plot([minutes], [test_bleu], "r*", markersize=12, label="test2016, beam 4, averaged model")
    axis.set_xlabel("minutes of training (a resumed run's parts summed)")
    axis.set_ylabel("sacreBLEU (cased)")
    axis.grid(True, alpha=0.3)
    axis.legend(loc="lower right")
    path = pathlib.Path(model_dir) / "bleu_minutes.png"
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def main(argv=None):
    args = parse_args(argv)
    budget = f"budget {args.minutes:g} min" if args.minutes else "the preset's budget"
    print(harness.header("multi30k", f"{budget}, preset {args.config}"), flush=True)
    results = train(args)
    data = pathlib.Path(args.data)
    sources, references = (harness.read_lines(data / f"{args.test}.{lang}") for lang in ("en", "de"))
    if len(sources) != len(references):
        sys.exit(f"multi30k: {data / args.test}.en has {len(sources)} lines, .de {len(references)}: "
                 f"the split's files must be line-aligned")
    from keras_transformer.training.evaluation import corpus_bleu  # after training: the import loads Keras

    started = time.time()
    hypotheses = translate(results["export"], sources)
    seconds = time.time() - started
    score, cased = corpus_bleu(hypotheses, references)
    lower, lowercased = corpus_bleu(hypotheses, references, lowercase=True)
    (pathlib.Path(args.model_dir) / f"{args.test}.export.hyp.de").write_text("\n".join(hypotheses) + "\n",
                                                                              encoding="utf-8")
    minutes = results.get("train_minutes", float("nan"))
    png = plot(args.model_dir, score.score, minutes)
    print(f"# trained {results['steps']} steps in {minutes} min"
          + (" (stopped by the time budget)" if results.get("stopped_by_time_budget") else "")
          + f"; {results.get('averaged_checkpoints')} checkpoints averaged; export {results['export']}")
    print(f"# {len(sources)} {args.test} sentences translated by the export's {SIGNATURE} in {seconds:.1f} s")
    print(f"# {args.test} cased BLEU {score.score:.2f} [{cased}]")
    print(f"# {args.test} lowercased BLEU {lower.score:.2f} [{lowercased}]")
    print(literature_line(args.test, hypotheses, references, args.tokenized))
    print(f"# curve: {png}")
    if args.patience:
        decoding = decoding_options(results["export"], args.patience_beam)
        beam, alpha, extra = decoding
        print(f"# translate_options (beam {beam}, alpha {alpha:g}, +{extra}, no XLA) with CTranslate2's patience "
              "stop; cased BLEU:")
        splits = ["valid", args.test] if args.test != "valid" else ["valid"]
        print("\n".join(patience_table(results["export"], data, splits, args.patience, decoding)))
    print(harness.finish(f"{args.test}_bleu", f"{score.score:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
