"""Does syntax help? Plain vs syntax-aware input vs syntax-aware attention vs both.

    python -m benchmarks.syntax --out runs/syntax-bench

On the embedded corpus with its gold trees (the generator knows its grammar,
`keras_transformer.data.embedded.embedded_annotations`), for each training
set size (`--sizes`, the first N pairs of the same generated stream) and
each seed, trains four `tiny` models with `train.py` for the same number of
steps on the same CoNLL-U data directory (the plain model reads the same
words, joined by spaces) and scores the averaged model on the 500 held-out
test sentences (beam 4, cased sacreBLEU):

* `plain`: the paper's model;
* `tags`: `--source-tags upos,deprel` (sum of embeddings, survey Eqs. 50-51);
* `attention`: `--syntax-attention hard --syntax-max-distance 2
  --syntax-layers 0` (0-1 masking of the lowest encoder layer's
  self-attention to tree neighbours within 2 edges, Eq. 53);
* `both`: the two together.

On real text (`--data`), a directory written by `python -m
keras_transformer.parsing corpus` (the parser's CoNLL-U of every source
split beside the targets, no plain source: the plain model reads the
parser's words, so only the annotations differ), the same four variants of
`--config` (e.g. `multi30k`) each train for `--minutes` of wall clock, and
the table gives valid and test BLEU (train.py's own, beam and averaging of
the preset) per variant:

    python -m benchmarks.syntax --out runs/syntax-multi30k --data runs/multi30k-parsed --config multi30k --minutes 56

Finished runs are reused (their `results.json`), so an interrupted
benchmark continues where it stopped. It prints a Markdown table (mean
BLEU over seeds, and each seed) and writes `OUT/syntax_bleu.png` and
`OUT/summary.json`, for the variants and seeds of the command. With
`--finished-only` it trains nothing and reports the finished runs among
them, a missing seed shown as `-` (the table of a benchmark still under
way, or run one variant at a time):

    python -m benchmarks.syntax --out runs/syntax-multi30k --data runs/multi30k-parsed --config multi30k --minutes 56 --finished-only

Run directories are large and do not outlive a machine, though the figures
of an hour-long run on real text should. `--record FILE` keeps each
finished run's `results.json` (figures only: steps, minutes, BLEU) in one
small JSON file that is committed beside this script
(`benchmarks/results/syntax_multi30k.json`).
A run missing on disk but present there counts as finished and is not
trained again, so the table of a benchmark spread over several machines is
one command:

    python -m benchmarks.syntax --out runs/syntax-multi30k --data runs/multi30k-parsed --config multi30k --minutes 56 --record benchmarks/results/syntax_multi30k.json --finished-only
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

from benchmarks import harness

REPO_ROOT = harness.REPO_ROOT

VARIANTS = {
    "plain": [],
    "tags": ["--source-tags", "upos,deprel"],
    "attention": ["--syntax-attention", "hard", "--syntax-max-distance", "2", "--syntax-layers", "0"],
    "both": ["--source-tags", "upos,deprel", "--syntax-attention", "hard", "--syntax-max-distance", "2",
             "--syntax-layers", "0"],
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for the data, the runs and the summary")
    parser.add_argument("--sizes", default="1000,3000,10000,30000", help="training pairs (comma-separated)")
    parser.add_argument("--seeds", default="0,1", help="training seeds (comma-separated)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {list(VARIANTS)}")
    parser.add_argument("--steps", type=int, default=400, help="training steps of every run (default 400)")
    parser.add_argument("--valid", type=int, default=100, help="validation sentences (default 100)")
    parser.add_argument("--train-args", default="", help="extra train.py flags (smoke tests)")
    parser.add_argument("--data", default=None,
                        help="real text instead of the embedded corpus: a directory written by "
                             "`python -m keras_transformer.parsing corpus` (--sizes, --steps and --valid unused)")
    parser.add_argument("--config", default=None, help="with --data: train.py's --config (e.g. multi30k)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="with --data: train.py's --max-minutes, the same wall clock for every run")
    parser.add_argument("--finished-only", action="store_true",
                        help="train nothing: the table, summary and plot of the runs already finished")
    parser.add_argument("--record", default=None,
                        help="a JSON file of finished runs' results by run name: read for runs no longer on "
                             "disk, updated with every run found or trained (benchmarks/results/*.json)")
    args = parser.parse_args(argv)
    if (args.config or args.minutes) and not args.data:
        parser.error("--config and --minutes go with --data")
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.variants = args.variants.split(",")
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}, expected some of {list(VARIANTS)}")
    return args


def write_data(directory: pathlib.Path, size: int, valid: int) -> pathlib.Path:
    """The first `size` training pairs of the embedded corpus (seed 0), its first `valid`
    validation pairs and all test pairs, as `SPLIT.en.conllu` + `SPLIT.de`."""
    from keras_transformer.data.embedded import embedded_annotations, embedded_corpus
    from keras_transformer.data.syntax import to_conllu

    if (directory / "test.de").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    annotations, pairs = embedded_annotations(seed=0, train_size=size), embedded_corpus(seed=0)
    for split, limit in (("train", size), ("valid", valid), ("test", None)):
        sentences, targets = annotations[split][:limit], [de for _, de in pairs[split][:limit]]
        (directory / f"{split}.en.conllu").write_text("".join(to_conllu(s) + "\n\n" for s in sentences),
                                                      encoding="utf-8")
        (directory / f"{split}.de").write_text("".join(t + "\n" for t in targets), encoding="utf-8")
    return directory


def run(data: pathlib.Path, model_dir: pathlib.Path, variant: str, seed: int, budget: list[str], extra: list[str],
        finished_only: bool = False, record: dict | None = None):
    """train.py on `data` with the variant's flags and `budget` (`--steps N`, or `--config C
    --max-minutes M`), unless `model_dir` holds a finished run or `record` (run name ->
    results, `--record`) has it; its results (None for a run not finished when
    `finished_only`). A run found or trained is added to `record`."""
    results = model_dir / "results.json"
    if not results.exists():
        if record is not None and model_dir.name in record:
            return record[model_dir.name]
        if finished_only:
            return None
        command = [sys.executable, str(REPO_ROOT / "train.py"), "--data", str(data), "--model-dir", str(model_dir),
                   *budget, "--seed", str(seed), "--bleu-every-sentences", "0", "--no-export",
                   *VARIANTS[variant], *extra]
        started = time.time()
        subprocess.run(command, check=True, cwd=REPO_ROOT, stdout=subprocess.DEVNULL)  # train.py: quiet on its own
        print(f"  {model_dir.name}: {time.time() - started:.0f} s", flush=True)
    figures = json.loads(results.read_text())
    if record is not None:
        record[model_dir.name] = figures
    return figures


def read_record(path) -> dict | None:
    """`--record`: the finished runs' results by run name ({} for a file not there yet)."""
    if path is None:
        return None
    path = pathlib.Path(path)
    return json.loads(path.read_text()) if path.exists() else {}


def write_record(path, record: dict | None) -> None:
    if path is not None:
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(sorted(record.items())), indent=1) + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # --finished-only from a record: no run made it
    extra = args.train_args.split()
    if args.data:
        return main_real_text(args, out, extra)
    table, record = {}, read_record(args.record)
    for size in args.sizes:
        data = write_data(out / "data" / f"train{size}", size, args.valid)
        for variant in args.variants:
            for seed in args.seeds:
                results = run(data, out / "runs" / f"{size}-{variant}-seed{seed}", variant, seed,
                              ["--steps", str(args.steps)], extra, args.finished_only, record)
                write_record(args.record, record)
                table.setdefault(size, {}).setdefault(variant, []).append(results and results["test_bleu"])
                if results:
                    print(f"size {size} {variant} seed {seed}: test BLEU {results['test_bleu']:.2f}", flush=True)
    print(harness.table(["training pairs", *args.variants], [
        [f"{size:,}", *[_mean_and_seeds(v) for v in row.values()]] for size, row in table.items()]))
    summary = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
               "steps": args.steps, "seeds": args.seeds, "variants": {v: VARIANTS[v] for v in args.variants},
               "test_bleu": {str(size): row for size, row in table.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(table, out / "syntax_bleu.png", args.steps)
    print(f"wrote {out / 'syntax_bleu.png'}")
    return 0


def _mean_and_seeds(values) -> str:
    """A table cell: the mean BLEU of the finished seeds, then each seed's, `-` for one not
    finished (`--finished-only`): `52.00 (50.00, 54.00)`, `50.00 (50.00, -)`."""
    finished = _finished(values)
    if not finished:
        return "-"
    seeds = ", ".join("-" if b is None else f"{b:.2f}" for b in values)
    return f"{sum(finished) / len(finished):.2f} ({seeds})"


def _finished(values) -> list[float]:
    """The scores of the finished runs (None marks a run not finished)."""
    return [b for b in values if b is not None]


def main_real_text(args, out: pathlib.Path, extra: list[str]) -> int:
    """`--data`: every variant and seed on the parsed corpus at the same budget; valid and test BLEU."""
    data = pathlib.Path(args.data)
    budget = (["--config", args.config] if args.config else []) + (
        ["--max-minutes", f"{args.minutes:g}"] if args.minutes else [])
    scores, record = {}, read_record(args.record)
    for variant in args.variants:
        for seed in args.seeds:
            results = run(data, out / "runs" / f"{data.name}-{variant}-seed{seed}", variant, seed, budget, extra,
                          args.finished_only, record)
            write_record(args.record, record)  # after each run: an interrupted benchmark keeps the finished ones
            for split in ("valid", "test"):
                scores.setdefault(variant, {}).setdefault(split, []).append(results and results[f"{split}_bleu"])
            if results:
                print(f"{data.name} {variant} seed {seed}: {results.get('steps')} steps, valid BLEU "
                      f"{results['valid_bleu']:.2f}, test BLEU {results['test_bleu']:.2f}", flush=True)

    print(harness.table(["variant", "valid BLEU, mean (seeds)", "test BLEU, mean (seeds)"],
                        [[variant, _mean_and_seeds(row["valid"]), _mean_and_seeds(row["test"])]
                         for variant, row in scores.items()]))
    summary = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
               "data": str(data), "config": args.config, "minutes": args.minutes, "seeds": args.seeds,
               "variants": {v: VARIANTS[v] for v in args.variants}, "bleu": scores}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot_variants(scores, out / "syntax_bleu.png", f"{data.name}, {args.config or 'default'}"
                  + (f", {args.minutes:g} min" if args.minutes else ""))
    print(f"wrote {out / 'syntax_bleu.png'}")
    return 0


def plot_variants(scores, path, title):
    """Valid and test BLEU per variant: the mean of the seeds, each seed a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = [v for v in scores if _finished(scores[v]["test"])]
    fig, ax = plt.subplots(figsize=(6, 4))
    for offset, split in ((-0.1, "valid"), (0.1, "test")):
        xs = [i + offset for i in range(len(variants))]
        finished = [_finished(scores[v][split]) for v in variants]
        means = [sum(f) / len(f) for f in finished]
        line, = ax.plot(xs, means, marker="o", linestyle="", label=f"{split} (mean)")
        for x, f in zip(xs, finished):
            ax.scatter([x] * len(f), f, s=10, alpha=0.5, color=line.get_color())
    ax.set_xticks(range(len(variants)), variants)
    ax.set_ylabel("BLEU (cased)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(table, path, steps):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(table)
    fig, ax = plt.subplots(figsize=(6, 4))
    for variant in next(iter(table.values())):
        finished = {s: f for s in sizes if (f := _finished(table[s][variant]))}
        line, = ax.plot(list(finished), [sum(f) / len(f) for f in finished.values()], marker="o", label=variant)
        for s, f in finished.items():
            ax.scatter([s] * len(f), f, s=10, alpha=0.5, color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel("training pairs (embedded corpus, gold trees)")
    ax.set_ylabel("test BLEU (beam 4)")
    ax.set_title(f"tiny, {steps} steps: mean of seeds (dots: each seed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
