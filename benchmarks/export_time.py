"""How long an export takes to write and a server takes to load it.

    python -m benchmarks.export_time --shape multi30k --output /tmp/export-time

Builds a model of a preset's shape with random weights (`--seed`; the shape
is what the graph depends on, not the weights) and a SentencePiece tokenizer
of the preset's vocabulary size trained on `--data`'s training split (the
shared Multi30k by default), then times `export.saved_model.export_model`
in this process and prints the size of `saved_model.pb` and how many
functions its library holds. Then, `--rounds` times, each in a fresh
process (what a server starting or rolling out a version pays):

* `tf.saved_model.load` (TF2, what `export.translate` uses), then the first
  call of `serving_default` and of `translate_options` (beam 4) on one
  sentence: a signature's first call instantiates its graph;
* `tf.compat.v1.saved_model.loader.load` in a session (TF1: how TF Serving
  and `saved_model_cli` load a model), then the first `serving_default` run.

`--signatures NAME,...` exports `serving_default` and those only (what
`export.saved_model --signatures` saves). Compare two versions of the export code by running this from two worktrees,
one after the other, with the machine otherwise idle. The last line is
`export_seconds: X`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import time

from benchmarks import harness

SENTENCE = "A man in a blue shirt is standing on a ladder."

# Run in a fresh interpreter: argv[1] the version directory, argv[2] "tf2" or "tf1".
CHILD = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the tokenizer's ops)
path, kind, sentence = sys.argv[1], sys.argv[2], sys.argv[3]
out = {}
start = time.perf_counter()
if kind == "tf2":
    loaded = tf.saved_model.load(path)
    out["load"] = time.perf_counter() - start
    start = time.perf_counter()
    loaded.signatures["serving_default"](text=tf.constant([sentence]))
    out["first_serving_default"] = time.perf_counter() - start
    if "translate_options" in loaded.signatures:
        start = time.perf_counter()
        loaded.signatures["translate_options"](
            text=tf.constant([sentence]), beam_size=tf.constant(4), alpha=tf.constant(0.6),
            extra_length=tf.constant(50), num_results=tf.constant(1), patience=tf.constant(0.0))
        out["first_translate_options"] = time.perf_counter() - start
else:
    tf.compat.v1.disable_eager_execution()
    with tf.compat.v1.Session(graph=tf.Graph()) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
        out["load"] = time.perf_counter() - start
        signature = meta.signature_def["serving_default"]
        start = time.perf_counter()
        session.run(signature.outputs["translation"].name, {signature.inputs["text"].name: [sentence]})
        out["first_serving_default"] = time.perf_counter() - start
print(json.dumps(out))
"""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="multi30k", help="a preset name (default: multi30k)")
    parser.add_argument("--data", default=str(harness.SHARED_DATA / "multi30k"),
                        help="text-directory corpus for the tokenizer (default: the shared Multi30k)")
    parser.add_argument("--vocab-size", type=int, default=None, help="default: the preset's")
    parser.add_argument("--output", required=True, help="export base directory (replaced)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per loader (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--signatures", default=None, metavar="NAME,...",
                        help="export only serving_default and these (export.saved_model --signatures; default: all)")
    return parser.parse_args(argv)


def fresh_process(version_dir, kind: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", CHILD, str(version_dir), kind, SENTENCE],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.time()
    import keras
    import tensorflow as tf

    from export.op_audit import saved_model_ops
    from export.saved_model import export_model
    from keras_transformer import TransformerConfig, build_transformer

    config = TransformerConfig.from_preset(args.shape, **({"vocab_size": args.vocab_size} if args.vocab_size else {}))
    _, tokenizer = harness.tokenized_corpus(args.data, config.vocab_size, seed=args.seed)
    keras.utils.set_random_seed(args.seed)
    model = build_transformer(config)
    print(harness.header("export time", harness.versions(tf, keras),
                         f"random {args.shape} shape ({config.depth_text} layers, d_model {config.d_model}, "
                         f"vocab {config.vocab_size}), seed {args.seed}; signatures: "
                         f"{args.signatures or 'all'}"))
    output = pathlib.Path(args.output)
    shutil.rmtree(output, ignore_errors=True)
    start = time.perf_counter()
    signatures = None if args.signatures is None else [n for n in args.signatures.split(",") if n]
    version = export_model(model, config, tokenizer, output, signatures=signatures)
    export_seconds = time.perf_counter() - start
    size = (version / "saved_model.pb").stat().st_size
    print(f"export: {export_seconds:.1f} s; saved_model.pb {size / 1e6:.1f} MB, "
          f"{len(saved_model_ops(version)[1])} functions in its library")
    rows = []
    for kind, label in (("tf2", "tf.saved_model.load"), ("tf1", "TF1 session loader")):
        runs = [fresh_process(version, kind) for _ in range(args.rounds)]
        for key in runs[0]:
            rows.append([label, key.replace("_", " "), harness.spread([run[key] for run in runs], "{:.1f}")])
    print(f"seconds in a fresh process, median (min-max) of {args.rounds}:")
    print(harness.table(["loader", "step", "seconds"], rows))
    print(harness.finish("export_seconds", f"{export_seconds:.1f}", started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
