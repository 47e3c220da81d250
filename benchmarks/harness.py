"""What every benchmark here shares, written once.

* `header` / `finish`: the first line (date, machine, CPUs, load average,
  versions and settings) and the last two (load average at the end, then
  the `name: value` line a script's caller reads);
* `set_threads`: TensorFlow's intra- and inter-op threads;
* `interleaved_rounds`: the one rounds policy: every variant once per round,
  the order rotating by one variant each round (each goes first in turn,
  so background load on this shared machine hits all alike); reported as
  `spread` (median, then min-max over the rounds) and, between variants,
  as the median of per-round ratios (`round_ratios`);
* `table`: a markdown table with its separator;
* fixtures: `tokenized_corpus` (corpus -> a throwaway SentencePiece
  tokenizer), `training_batches` (-> token-budget batches, as `train.py`
  feeds them) and `compiled_model` (the model compiled as `train.py`
  compiles it).

Nothing here imports TensorFlow or Keras at module level: `gpu_step` runs
where only JAX is installed.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import statistics
import tempfile
import time
from typing import Callable, Mapping, Sequence

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
# The shared data (never copied into the repository): `../shared/data` beside the checkout.
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def header(title: str, *facts: str) -> str:
    """`# TITLE: DATE, HOST, N CPU(s), load average L at start; FACT; FACT ...`."""
    line = (f"# {title}: {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, {os.cpu_count()} CPU(s), "
            f"load average {os.getloadavg()[0]:.2f} at start")
    return "; ".join([line, *[fact for fact in facts if fact]])


def versions(*modules) -> str:
    """`TF 2.21.0 (oneDNN off), Keras 3.12.0, ...` for the given imported modules: with
    TensorFlow, whether its oneDNN kernels run in this process (the CPU or
    `TF_ENABLE_ONEDNN_OPTS` decides; `train.py` and `export.translate` turn them on)."""
    names = {"tensorflow": "TF", "keras": "Keras", "keras_hub": "keras-hub", "ctranslate2": "CTranslate2",
             "jax": "JAX"}

    def version(module):
        text = f"{names.get(module.__name__, module.__name__)} {module.__version__}"
        if module.__name__ == "tensorflow":
            from keras_transformer.console import onednn_state

            text += f" (oneDNN {onednn_state()})"
        return text

    return ", ".join(version(m) for m in modules)


def finish(name: str, value: str, started: float | None = None) -> str:
    """The closing lines: `# [total N s; ]load average L at end`, then `NAME: VALUE`,
    the line a caller of the script reads."""
    total = f"total {time.time() - started:.0f} s; " if started is not None else ""
    return f"# {total}load average {os.getloadavg()[0]:.2f} at end\n{name}: {value}"


def set_threads(threads: int) -> None:
    """TensorFlow's intra- and inter-op thread pools to `threads` each (0: as they are)."""
    if threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def interleaved_rounds(calls: Mapping[str, Callable[[], float | None]], rounds: int, pause: float = 0.0,
                       after_round: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Seconds of each call in each of `rounds` rounds. Every call runs once per round;
    round r starts with the call r places along (mod the number of calls) and goes on in
    order, so each call goes first in turn. A call that returns a number reports its own
    seconds (e.g. timed in a worker process); otherwise its wall-clock time counts.
    `pause` seconds are slept before each call (untimed), for engines whose threads
    spin for a while after a call. `after_round` (untimed) runs at the end of each round,
    e.g. a reference measurement taken under the same load."""
    names = list(calls)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if pause:
                time.sleep(pause)
            start = time.perf_counter()
            reported = calls[name]()
            seconds[name].append(time.perf_counter() - start if reported is None else float(reported))
        if after_round is not None:
            after_round()
    return seconds


def spread(values: Sequence[float], form: str = "{:.2f}") -> str:
    """`median (min-max)`, each formatted with `form`."""
    return f"{form.format(statistics.median(values))} ({form.format(min(values))}-{form.format(max(values))})"


def round_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """The ratio of two variants' figures round by round (the same background load)."""
    return [n / d for n, d in zip(numerators, denominators)]


def table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table: the header row, its separator, then `rows`."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def read_lines(path, count: int | None = None) -> list[str]:
    """The first `count` lines of a UTF-8 text file (all with `None`), without newlines."""
    lines = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if count is not None and len(lines) == count:
                break
            lines.append(line.rstrip("\n"))
    return lines


def tokenized_corpus(data, vocab_size: int, seed: int = 0):
    """`(corpus, tokenizer)`: the text-directory corpus `data` (the embedded one when it
    is not a directory) and a SentencePiece tokenizer of `vocab_size` pieces trained on
    its training split in a temporary folder, as `train.py` trains one."""
    from keras_transformer.data import Tokenizer, load_corpus, train_tokenizer

    corpus = load_corpus(str(data) if pathlib.Path(data).is_dir() else "embedded", "en", "de", seed=seed)
    with tempfile.TemporaryDirectory() as work:
        tokenizer = Tokenizer.load(train_tokenizer(corpus.texts("train"), pathlib.Path(work) / "sp",
                                                   vocab_size, seed=seed))
    return corpus, tokenizer


def training_batches(corpus, tokenizer, config, batch_tokens: int, seed: int = 0):
    """The repeated, shuffled token-budget batches `train.py` feeds (a `tf.data.Dataset`)."""
    from keras_transformer.data import make_batches

    return make_batches(corpus.splits["train"], tokenizer, batch_tokens=batch_tokens,
                        max_length=config.max_length, shuffle=True, seed=seed, repeat=True)


def compiled_model(config, seed: int = 0, jit_compile: bool = False, loss=None, build=None, optimizer=None):
    """`build_transformer(config)` (or `build(config)`) from `seed`, compiled as `train.py`
    compiles it: the paper's Adam and schedule (or `optimizer`), the label-smoothed loss
    (or `loss`)."""
    import keras

    from keras_transformer import LabelSmoothedCrossEntropy, build_transformer, make_optimizer

    keras.utils.set_random_seed(seed)
    model = (build or build_transformer)(config)
    model.compile(optimizer=optimizer if optimizer is not None else make_optimizer(config), jit_compile=jit_compile,
                  loss=loss if loss is not None else LabelSmoothedCrossEntropy(config.label_smoothing))
    # Adam's slots made now, as train.py makes them (`training._compile_model`): Keras without
    # a strategy makes them inside the first train step's trace, 12x slower there (tiny
    # preset: 2.3 s against 0.19 s eagerly); the same variables and the same step graph.
    model.optimizer.build(model.trainable_variables)
    return model


def never_ending_model(config, seed: int = 0):
    """`build_transformer(config)` from `seed` whose outputs never end with EOS: the
    embedding row of EOS (tied to the output projection) is zero, so its logit is exactly
    0 while the best of the other random logits is above 0 every step, and every
    hypothesis runs to its length limit (equal output lengths by construction)."""
    import keras

    from keras_transformer import build_transformer
    from keras_transformer.constants import EOS_ID

    keras.utils.set_random_seed(seed)
    model = build_transformer(config)
    table = model.embedding.embeddings
    table.assign(keras.ops.where(keras.ops.arange(config.vocab_size)[:, None] == EOS_ID, 0.0, table))
    return model
