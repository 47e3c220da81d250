"""LiteRT size, speed and BLEU per `export.tflite --quantize` option.

    python -m benchmarks.litert_quantize --saved-model runs/multi30k/export/1 \\
        --source ../shared/data/multi30k/test2016.en --reference ../shared/data/multi30k/test2016.de

For each option (`none`, `float16`, `dynamic_int8`): converts the export's
`translate_litert` signature with `python -m export.tflite --quantize ...`,
translates every line of `--source` with the LiteRT interpreter in a fresh
subprocess (LiteRT checks run in subprocesses; one untimed warm-up call of 64
sentences first, then one timed pass over all lines, 64 per call), and scores
the output with sacreBLEU against `--reference` (cased, raw text). Prints the
file size, the conversion time, the translation time and BLEU, and the ratios
to `none`. `--work-dir DIR` keeps the models and translations in DIR. The
options run one after the other (one pass each, not interleaved): the speed
ratios are indicative on a shared machine; the sizes and BLEU are exact. Last
line: `OPTION_bleu_change: X` for the last option against `none` (by default
`dynamic_int8_bleu_change`), or `none_bleu: X` when `none` is the only option.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from benchmarks import harness

REPO_ROOT = harness.REPO_ROOT
OPTIONS = ("none", "float16", "dynamic_int8")

TRANSLATE = """
import json, sys, time
from export.tflite import load_interpreter, translate_lines
lines = [line.rstrip("\\n") for line in open(sys.argv[2], encoding="utf-8")]
interpreter = load_interpreter(sys.argv[1])
translate_lines(interpreter, lines[:64])  # warm-up
start = time.perf_counter()
hypotheses, _ = translate_lines(interpreter, lines)
seconds = time.perf_counter() - start
open(sys.argv[3], "w", encoding="utf-8").write("\\n".join(hypotheses) + "\\n")
print(json.dumps({"seconds": seconds}))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--saved-model", required=True, help="an export version directory, e.g. RUN/export/1")
    parser.add_argument("--source", required=True, help="source sentences, one per line")
    parser.add_argument("--reference", required=True, help="reference translations, one per line")
    parser.add_argument("--options", default=",".join(OPTIONS), help="comma-separated --quantize options")
    parser.add_argument("--work-dir", help="keep each option's LiteRT model (OPTION.tflite) and translations "
                                           "(OPTION.hyp) in this directory, made if missing (default: a "
                                           "temporary directory, removed at the end)")
    args = parser.parse_args(argv)
    from keras_transformer.training.evaluation import corpus_bleu

    options = [o.strip() for o in args.options.split(",") if o.strip()]
    references = harness.read_lines(args.reference)
    env = dict(os.environ, KERAS_TRANSFORMER_QUIET="1", TF_CPP_MIN_LOG_LEVEL="3")
    print(harness.header("LiteRT quantization", f"{args.saved_model} on {args.source}"))
    results = {}
    with tempfile.TemporaryDirectory() as temporary:
        work = args.work_dir or temporary
        pathlib.Path(work).mkdir(parents=True, exist_ok=True)
        for option in options:
            model = pathlib.Path(work) / f"{option}.tflite"
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "export.tflite", "--saved-model", args.saved_model,
                            "--output", str(model), "--quantize", option], cwd=REPO_ROOT, env=env, check=True,
                           capture_output=True)
            convert_seconds = time.perf_counter() - start
            hypotheses = pathlib.Path(work) / f"{option}.hyp"
            out = subprocess.run([sys.executable, "-c", TRANSLATE, str(model), args.source, str(hypotheses)],
                                 cwd=REPO_ROOT, env=env, check=True, capture_output=True, text=True)
            seconds = json.loads(out.stdout.strip().splitlines()[-1])["seconds"]
            bleu, signature = corpus_bleu(harness.read_lines(hypotheses), references)
            results[option] = dict(size=model.stat().st_size, seconds=seconds, bleu=bleu.score)
            print(f"| {option} | {model.stat().st_size / 2**20:.2f} MiB | convert {convert_seconds:.0f} s | "
                  f"translate {seconds:.1f} s | BLEU {bleu.score:.2f} |", flush=True)
    base = results.get("none")
    if base:
        for option, r in list(results.items())[1:]:
            print(f"# {option} vs none: size {r['size'] / base['size']:.2f}x, time {r['seconds'] / base['seconds']:.2f}x, "
                  f"BLEU {r['bleu'] - base['bleu']:+.2f}")
    print(f"# BLEU signature: {signature}")
    last, result = list(results.items())[-1]
    if base and last != "none":
        print(harness.finish(f"{last}_bleu_change", f"{result['bleu'] - base['bleu']:+.2f}"))
    else:
        print(harness.finish(f"{last}_bleu", f"{result['bleu']:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
