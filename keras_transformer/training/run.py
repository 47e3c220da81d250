"""One training run: corpus -> tokenizer -> batches -> `fit` -> checkpoints ->
averaged weights -> BLEU (TensorFlow-only code, like `data/`).

    from keras_transformer.config import TrainingConfig
    from keras_transformer.training.run import train_and_evaluate
    run = train_and_evaluate(TrainingConfig.create("tiny", model_dir="runs/x"))
    run.results["test_bleu"]

`fit` runs under `tf.distribute.MirroredStrategy` over all visible GPUs (the
default strategy on one device) in rounds of `checkpoint_every` steps; each
round ends with a checkpoint, a greedy BLEU on a validation subset and a
row of `history.csv`. Re-running resumes from the newest complete checkpoint
(after Ctrl-C, SIGTERM or kill -9 alike). SIGTERM or a first Ctrl-C ends the
current step, writes a checkpoint and returns (`TrainedRun.interrupted`);
a NaN or infinite loss stops training before any checkpoint of its weights is
written (`NonFiniteLossError`). The export is not done here: `train.py`
calls `export.saved_model` with the returned model.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import time
import warnings

import keras
import numpy as np
import tensorflow as tf

from keras_transformer import console, run_dir
from keras_transformer.config import TrainingConfig, TransformerConfig
from keras_transformer.training.callbacks import (CheckpointAndBleu, EarlyStopping, NonFiniteLossError, Progress,
                                                  StepGuard, TimeBudget, rounds_without_improvement)
from keras_transformer.training.distribute import (any_worker, cluster_tasks, enable_multi_worker_fit, is_chief,
                                                   is_multi_worker, make_strategy, wait_for_tokenizer)
from keras_transformer.training.evaluation import compute_bleu, out_of_memory_reason, plot_curves
from keras_transformer.training.initial_run import fine_tuning_config, initial_run, initialize_from, take_tokenizer
from keras_transformer.training.losses import TargetTokens
from keras_transformer.training.stop_signals import Interrupted, StopSignals
from keras_transformer.inference.translator import Translator

log = logging.getLogger("keras_transformer.training")


@dataclasses.dataclass
class TrainedRun:
    """What `train_and_evaluate` leaves: the averaged model and its figures.

    `interrupted` is True when a signal stopped training early (a checkpoint
    was written; the same command resumes); the model then holds the
    weights of that moment, not an average, and nothing was evaluated.
    """

    model: keras.Model
    config: TransformerConfig
    tokenizer: object
    results: dict
    model_dir: pathlib.Path
    interrupted: bool = False
    chief: bool = True  # False for a multi-worker non-chief: nothing to evaluate or export


# -- pieces ----------------------------------------------------------------

def prepare_tokenizer(model_dir, corpus, vocab_size, seed):
    """Loads `model_dir/tokenizer.model`, or trains it on both sides of the training split.
    A tokenizer already there is the run's: an earlier part's, or one of the user's own put
    there before the first part (docs/data.md, "The tokenizer")."""
    from keras_transformer.data import Tokenizer, tokenizer_path, train_tokenizer

    path = tokenizer_path(model_dir)
    trained = not path.exists()
    if trained:
        log.info("training a %d-piece SentencePiece vocabulary on %s", vocab_size, corpus.name)
        train_tokenizer(corpus.texts("train"), path.with_suffix(""), vocab_size, seed=seed)
    tokenizer = Tokenizer.load(path)
    if not trained:
        log.info("tokenizer %s: %d pieces, the run's own (--vocab-size is not used)", path, tokenizer.vocab_size)
    if trained and tokenizer.vocab_size < vocab_size:  # `vocab_size` is an upper bound (hard_vocab_limit off)
        log.info("the vocabulary has %d pieces: the training text holds fewer than the %d asked",
                 tokenizer.vocab_size, vocab_size)
    return tokenizer


# -- the run -----------------------------------------------------------------------

# `mixed_float16`'s first loss scale (Keras's default); halved at every overflowing step.
INITIAL_LOSS_SCALE = 2.0 ** 15


def mixed_precision_policy() -> str:
    """`--mixed-precision`'s policy: mixed_float16 (with loss scaling) on GPUs,
    mixed_bfloat16 (no scaling needed) on CPU."""
    return "mixed_float16" if tf.config.list_logical_devices("GPU") else "mixed_bfloat16"


# CPU flags of bfloat16 arithmetic: x86 AVX-512 BF16 and AMX (Linux `flags`), Arm BF16 (`Features`).
BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_has_bfloat16(cpuinfo: str | None = None) -> bool | None:
    """Whether the CPU computes in bfloat16, from `/proc/cpuinfo` (or the given
    text of one): any of `BFLOAT16_CPU_FLAGS` among its `flags` or `Features`.
    None where that cannot be told (no `/proc/cpuinfo`, as on macOS)."""
    if cpuinfo is None:
        try:
            cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return any(flag in flags for flag in BFLOAT16_CPU_FLAGS) if flags else None


def mixed_precision_warnings(policy: str, has_bfloat16: bool | None, jit_compile: bool = False) -> list[str]:
    """The lines `train_and_evaluate` logs when `--mixed-precision` will not pay on a CPU
    (`policy` mixed_bfloat16):
    - on a CPU without bfloat16 instructions, where TensorFlow converts around every
      product: there the `multi30k` preset trained at 0.73x the float32 speed and
      `base` at 0.78x (a 2-vCPU AVX2 AMD EPYC; on AVX-512 BF16 CPUs `small` trained
      1.4x and `base` 1.6x faster). AMX and Arm BF16 CPUs compute in bfloat16 too,
      so they get no warning (not measured here);
    - with `--jit-compile`, where XLA undid bfloat16's gain on the AVX-512 BF16 CPU:
      `small`'s step took 1.06x float32's with both, 0.71x with bfloat16 alone.
    (docs/lab-notebook, "Training throughput" and "Mixed precision on a CPU without
    bfloat16 instructions".)"""
    if policy != "mixed_bfloat16":
        return []
    lines = []
    if has_bfloat16 is False:
        lines.append("--mixed-precision: this CPU has no bfloat16 instructions (none of "
                     f"{', '.join(BFLOAT16_CPU_FLAGS)} in /proc/cpuinfo), so mixed_bfloat16 trains slower than "
                     "float32 here (0.73x for the multi30k preset on an AVX2 CPU, 1.4-1.6x faster on an AVX-512 "
                     "BF16 one; docs/lab-notebook). Drop --mixed-precision on this machine.")
    if jit_compile:
        lines.append("--mixed-precision with --jit-compile on a CPU: XLA undid bfloat16's gain (the small preset's "
                     "step took 1.06x float32's time with both, 0.71x with bfloat16 alone; docs/lab-notebook). "
                     "Drop --jit-compile.")
    return lines


def _fit(model, train_ds, **kwargs):
    """`model.fit(train_ds, **kwargs)` without Keras's "Your input ran out of data;
    interrupting training" warning. Keras 3.15.1 and earlier give it whenever a dataset of
    unknown length ends (keras-team/keras#23360 restricts it to a `steps_per_epoch` that the
    data could not fill): here the validation set at the end of every evaluation, while the
    training batches repeat without end, so the warning never means what it says. A program
    of the user's own calling `train_and_evaluate` printed it once a `fit` call."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*[Yy]our input ran out of data.*")
        model.fit(train_ds, **kwargs)


def _fit_rounds(model, train_ds, valid_ds, callbacks, start_step, steps, every, stopped=lambda: False,
                accumulate=1):
    """Runs `fit` from `start_step` to `steps` in rounds ending at multiples of
    `every` (and at `steps`), so checkpoints fall on the same steps whether or
    not the run was interrupted in between. `stopped()` true after a part:
    the time budget ran out, no further part runs. Steps are updates; with
    `accumulate` batches an update, `fit` reads that many batches per step."""
    def batches(updates):
        return updates * accumulate

    step = start_step
    offset = step % every
    if offset and step < steps:
        # Resumed mid-round (after a signal): finish that round first; the
        # rest then reads on from where this part's batches end.
        first = min(every - offset, steps - step)
        _fit(model, train_ds, epochs=1, steps_per_epoch=batches(first), validation_data=valid_ds,
             callbacks=callbacks, verbose=0, shuffle=False)
        train_ds = train_ds.skip(batches(first))
        step += first
    if step >= steps or stopped():
        return
    full_rounds, last = divmod(steps - step, every)
    if full_rounds:
        _fit(model, train_ds, epochs=step // every + full_rounds, initial_epoch=step // every,
             steps_per_epoch=batches(every), validation_data=valid_ds, callbacks=callbacks, verbose=0,
             shuffle=False)  # the dataset shuffles itself
        train_ds = train_ds.skip(batches(full_rounds * every))
    if last and not stopped():
        _fit(model, train_ds, epochs=1, steps_per_epoch=batches(last), validation_data=valid_ds,
             callbacks=callbacks, verbose=0, shuffle=False)


def averaged_checkpoints(store, every, steps, count):
    """The last `count` checkpoints on round boundaries (multiples of `every`,
    or the final step): a checkpoint written at a signal is not averaged."""
    from keras_transformer.training.checkpoints import checkpoint_step

    on_rounds = [path for path in store.paths if (step := checkpoint_step(path)) % every == 0 or step == steps]
    return on_rounds[-count:]


def train_and_evaluate(run: TrainingConfig) -> TrainedRun:
    """Runs the whole job for `run`; returns the averaged model and its figures.

    Raises `RunError`, `CorpusError`, `TokenizerError`, `CheckpointError`
    or `NonFiniteLossError` with a one-line message.
    """
    started = time.time()
    # Several workers (TF_CONFIG): the collective strategy must exist before any other op.
    strategy = make_strategy() if cluster_tasks() > 1 else None
    previous_policy = keras.mixed_precision.global_policy()
    if run.mixed_precision:
        policy = mixed_precision_policy()
        for warning in mixed_precision_warnings(policy, cpu_has_bfloat16(), run.jit_compile):
            log.warning("%s", warning)
        keras.mixed_precision.set_global_policy(policy)
    try:
        return _train_and_evaluate(run, started, strategy)
    finally:  # the policy the caller had, whichever way the run ends
        keras.mixed_precision.set_global_policy(previous_policy)


def _train_and_evaluate(run, started, strategy) -> TrainedRun:
    """`train_and_evaluate` once the global dtype policy is set, holding the run directory's
    lock (`run_dir.ModelDirLock`; the chief only: the workers of one multi-worker run share
    the directory)."""
    chief = strategy is None or is_chief(strategy)
    model_dir = run_dir.make_model_dir(run.model_dir)
    lock = run_dir.ModelDirLock(model_dir) if chief else None
    try:
        return _train_in(run, started, strategy, chief, model_dir)
    finally:
        if lock is not None:
            lock.release()


def _train_in(run, started, strategy, chief, model_dir) -> TrainedRun:
    """`_train_and_evaluate` in a run directory that no other `train.py` trains in."""
    keras.utils.set_random_seed(run.seed)
    corpus, tokenizer, config, init_from = _prepare_data(run, model_dir, chief)
    strategy = strategy or make_strategy()
    data = _make_datasets(run, corpus, tokenizer, config, strategy.num_replicas_in_sync)
    if run.early_stopping and data.valid_split is None:
        raise run_dir.RunError(f"--early-stopping {run.early_stopping} watches the validation loss, and "
                               f"{corpus.name} has no validation data")
    model = _compile_model(run, config, strategy)
    store, start_step, worker_dir = _checkpoint_store(model, tokenizer, model_dir, strategy, chief, run)
    if init_from is not None and start_step == 0:  # (a resumed run goes on from its own checkpoints)
        initialize_from(model, init_from)
    if start_step:  # a resumed part reads a fresh shuffle, with fresh dropout masks
        part_seed = data_seed(run.seed, start_step)
        data.train = data.training_batches(part_seed)
        reseed_dropout(model, part_seed)
    onednn = console.onednn_state()
    log.info("%d replica(s); %d steps in rounds of %d%s; resuming at step %d; TensorFlow's oneDNN kernels %s",
             strategy.num_replicas_in_sync, run.steps, run.checkpoint_every,
             f" (each step an update of {run.accumulate} batches of {run.batch_tokens} tokens)"
             if run.accumulate > 1 else "", start_step, onednn)
    if start_step >= run.steps:  # (a rerun with a lower --steps said only "20 steps ...; resuming at step 40")
        log.info("the run is at step %d, %s --steps %d: nothing to train; it is averaged and evaluated "
                 "as it is", start_step, "past" if start_step > run.steps else "at", run.steps)
    if console.quiet_requested() and onednn == "on":
        console.say_onednn_fallback()  # said and dropped here, not among the first round's lines

    translator = Translator(model, config, tokenizer.model_bytes)
    # A resumed run's minutes (history.csv, results.json's `train_minutes`) go on from the
    # parts before it; its time budget (`--max-minutes`) is this process's own.
    trained_before = run_dir.minutes_before(model_dir, start_step) if chief and start_step else 0.0
    progress = Progress(run.steps, budget_seconds=run.max_minutes * 60 or None, started=started)
    signals = StopSignals()
    callbacks, budget, early = _callbacks(run, store, translator, data, model_dir, progress, signals, strategy,
                                          chief, started, trained_before)
    stopped_early = _stopped_early(run, model_dir, start_step)
    interrupted = None if stopped_early else _train(run, model, data, callbacks, start_step, store, progress,
                                                    signals, budget, strategy, early)
    if interrupted is not None:
        return TrainedRun(model, config, tokenizer, {"steps": interrupted, "interrupted": signals.received},
                          model_dir, interrupted=True)
    if not chief:  # the chief averages, evaluates and exports
        return _leave_worker(model, config, tokenizer, model_dir, worker_dir, strategy)
    results = _average(run, model, config, store, model_dir, started, budget, trained_before, start_step)
    if early and early.stopped:
        stopped_early = {"step": results["steps"], "best_step": early.best_step, "patience": run.early_stopping}
    if stopped_early:
        results["stopped_early"] = stopped_early
    if run.mixed_precision:
        model, translator = _float32_model(config, tokenizer, model_dir)
    results.update(_evaluate(run, translator, data, model_dir))
    plot_curves(model_dir)
    results["seconds"] = round(time.time() - started, 1)
    run_dir.write_results(model_dir, results)
    return TrainedRun(model, config, tokenizer, results, model_dir)


@dataclasses.dataclass
class _Datasets:
    """A run's data as `fit` and BLEU read it."""

    pairs: object  # split name -> dataset of (source, target) pairs (CoNLL-U sources when syntax-aware)
    train: object  # repeated, shuffled token-budget batches
    valid: object  # cached validation batches, or None
    valid_split: str | None
    splits: tuple  # every split of the corpus
    training_batches: object  # seed -> the training batches shuffled with it (`train`: the run's seed)


def _prepare_data(run, model_dir, chief):
    """The corpus, the tokenizer (trained by the chief, or the initial run's copied by it; waited
    for by the other workers), the model config and the initial run's directory (None: from
    scratch); refuses a run directory made for another config, tokenizer or data,
    and a corpus whose every pair is too long to batch."""
    from keras_transformer.data import count_overlong, load_corpus

    init_from, start = initial_run(run, model_dir)
    corpus = load_corpus(run.data, run.source_lang, run.target_lang, seed=run.seed)
    log.info("data %s (%s -> %s): %s", corpus.name, corpus.source_lang, corpus.target_lang,
             dict(corpus.sizes))
    if init_from is not None and chief:
        take_tokenizer(init_from, model_dir)
    tokenizer = (prepare_tokenizer(model_dir, corpus, run.vocab_size, run.seed) if chief
                 else wait_for_tokenizer(model_dir))
    config = fine_tuning_config(run, tokenizer.vocab_size, start, init_from)
    data_args = {"data": corpus.name, "source_lang": corpus.source_lang, "target_lang": corpus.target_lang}
    if chief:
        run_dir.check_run_file(model_dir, config, tokenizer, data_args, fingerprint=corpus.fingerprint(),
                               allow_data_change=run.allow_data_change, accumulate=run.accumulate,
                               init_from=init_from)
    log.info("config %s: %s", run.preset if init_from is None else f"{run.preset}'s training settings, the model "
             f"of {init_from}", config)
    overlong = count_overlong(corpus.splits["train"], tokenizer, config.max_length)
    log.info("training split: %s", overlong)
    if overlong.either >= overlong.pairs and not config.syntax_aware:  # syntax-aware sources are truncated
        where = " / ".join((corpus.files or {}).get("train", ())) or corpus.name
        raise run_dir.RunError(f"{where}: all {overlong.pairs} training pairs are longer than max_length="
                               f"{config.max_length} tokens (source {overlong.source}, target "
                               f"{overlong.target}), so no batch could ever be made; raise --max-length")
    return corpus, tokenizer, config, init_from


def _validation_options() -> tf.data.Options:
    """The validation batches' `tf.data` options: autotuning off. Keras's `evaluate` deletes the
    last round's validation iterator at the start of every round (`EpochIterator.reset`), and
    with autotuning on that deletion sometimes waits, idle, on the iterator's autotuning thread:
    ~44 s in 15 of the 27 rounds of a 56-minute Multi30k run on 2 cores (~11 minutes of its
    budget; stack and probe in docs/lab-notebook, #17's vocab-14000 row), 1.9 and 31.9 s in 2 of 8
    deletions of the same pipeline's iterator in a probe, never in 8 with autotuning off. The
    batches are cached after the first round, so there is nothing to tune."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def data_seed(seed: int, step: int) -> int:
    """The shuffle seed of the training batches of a run (or a resumed part of one) that
    starts at `step`: the run's `seed` from scratch; after a resume, one drawn from both,
    so that each part reads a fresh shuffle of the data. (With the run's seed each part read
    the first part's batches again from the first: a run trained in parts shorter than an
    epoch, under `--max-minutes` or a scheduler's pre-emptions, saw only its first batches.)"""
    if step == 0:
        return seed
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


def reseed_dropout(model, seed: int) -> None:
    """Sets the state of each of `model`'s Keras seed generators (its dropout masks') to one
    drawn from `seed`, for a resumed part. Keras keeps that state in variables that the
    checkpoints do not hold, so without it each part drew the first part's masks again, from
    the seeds the model was built with."""
    states = [v for v in model.variables if v.path.endswith("seed_generator_state")]
    draws = np.random.SeedSequence([seed, len(states)]).generate_state(len(states))
    for state, draw in zip(states, draws):
        state.assign(np.array([draw, 0], dtype=state.dtype))


def _make_datasets(run, corpus, tokenizer, config, replicas) -> _Datasets:
    """Token-budget batches for training (every batch a multiple of `replicas` sentences;
    shuffled with the run's seed, and with another through `training_batches`) and validation."""
    from keras_transformer.data import SubwordSampling, make_batches
    from keras_transformer.data.corpora import VALID_STEMS
    from keras_transformer.model import source_feature_names

    # A syntax-aware model reads CoNLL-U sources (pairs, batches, BLEU alike).
    pairs = corpus.annotated if config.syntax_aware else corpus.dataset
    syntax = dict(source_features=source_feature_names(config), tag_factors=config.source_tags)
    sampling = SubwordSampling(run.subword_alpha, run.subword_nbest) if run.subword_alpha else None
    if sampling:
        log.info("subword regularization: each training pair's segmentation sampled every epoch "
                 "(alpha %g, among the %s best)", sampling.alpha,
                 "all" if sampling.nbest_size < 0 else sampling.nbest_size)

    def training_batches(seed):
        try:
            return make_batches(pairs("train"), tokenizer, batch_tokens=run.batch_tokens,
                                max_length=config.max_length, shuffle=True, seed=seed, repeat=True,
                                batch_multiple=replicas, **syntax, subword_sampling=sampling)
        except ValueError as error:  # e.g. the budget cannot give every replica a longest pair
            raise run_dir.RunError(f"--batch-tokens {run.batch_tokens} with {replicas} replica(s): {error}") from None

    train = training_batches(run.seed)
    valid_split = "valid" if "valid" in corpus.splits else None
    if valid_split is None:  # optional, but a misnamed file (`newstest2013.en`) had passed in silence
        looked_for = (f"{' or '.join(f'{stem}.{corpus.source_lang}' for stem in VALID_STEMS)} with its "
                      f".{corpus.target_lang}" if (corpus.origin or {}).get("kind") == "directory"
                      else "a validation split")
        log.warning("%s has no validation data (looked for %s): this run has no validation loss, no BLEU "
                    "curve and no validation BLEU", corpus.name, looked_for)
    valid = None
    if valid_split:
        valid = make_batches(pairs(valid_split), tokenizer, batch_tokens=run.batch_tokens,
                             max_length=config.max_length, batch_multiple=replicas, **syntax).cache()
        valid = valid.with_options(_validation_options())
    return _Datasets(pairs, train, valid, valid_split, tuple(corpus.splits), training_batches)


def _compile_model(run, config, strategy):
    """The model, compiled with the paper's optimizer and loss under `strategy`
    (loss scaling under mixed_float16, its skipped steps counted)."""
    from keras_transformer import LabelSmoothedCrossEntropy, MaskedAccuracy, build_transformer, make_optimizer
    from keras_transformer.training.schedule import CountingLossScaleOptimizer

    with strategy.scope():
        model = build_transformer(config)
        optimizer = make_optimizer(config, run.accumulate)
        if keras.mixed_precision.global_policy().name == "mixed_float16":  # loss scaling, skips counted
            optimizer = CountingLossScaleOptimizer(optimizer, initial_scale=INITIAL_LOSS_SCALE)
        model.compile(optimizer=optimizer,
                      loss=LabelSmoothedCrossEntropy(config.label_smoothing),
                      metrics=[MaskedAccuracy(), TargetTokens()], jit_compile=run.jit_compile)
        model.optimizer.build(model.trainable_variables)
    enable_multi_worker_fit(model, strategy)
    return model


def _checkpoint_store(model, tokenizer, model_dir, strategy, chief, run):
    """Where this task saves, and the step it resumes from: `(store, start_step, worker_dir)`."""
    from keras_transformer.training.checkpoints import CheckpointStore

    chief_checkpoints = model_dir / run_dir.CHECKPOINT_DIR
    if chief:
        store = CheckpointStore(chief_checkpoints, model, model.optimizer, tokenizer.sha256,
                                max_to_keep=run.keep_checkpoints + 1)
        store.remove_unfinished_saves()
        return store, store.restore_latest(), None
    # Every worker saves (TensorFlow's rule for multi-worker checkpoints), a
    # non-chief into its own directory, removed at the end; all resume from
    # the chief's checkpoints.
    worker_dir = model_dir / f".worker-{strategy.cluster_resolver.task_id}"
    store = CheckpointStore(worker_dir / run_dir.CHECKPOINT_DIR, model, model.optimizer, tokenizer.sha256,
                            max_to_keep=1)
    start_step = CheckpointStore(chief_checkpoints, model, model.optimizer, tokenizer.sha256).restore_latest()
    return store, start_step, worker_dir


def _callbacks(run, store, translator, data, model_dir, progress, signals, strategy, chief, started,
               trained_before=0.0):
    """`(callbacks, budget, early)`: `fit`'s callbacks, in order, the time budget and the early
    stopping (each None when off), which come after the round's checkpoint and history row.
    `trained_before`: the minutes of the run's parts before this process
    (`run_dir.minutes_before`)."""
    every = run.checkpoint_every
    if chief:
        callbacks = [
            StepGuard(signals, strategy, run.accumulate),
            progress,
            CheckpointAndBleu(store, translator, data.pairs(data.valid_split) if data.valid_split else None,
                              run.bleu_every_sentences, model_dir, progress, started,
                              minutes_before=trained_before),
            keras.callbacks.TensorBoard(log_dir=str(model_dir / run_dir.LOG_DIR),
                                        update_freq=max(1, every * run.accumulate // 4)),  # in batches
        ]
    else:
        callbacks = [StepGuard(signals, strategy, run.accumulate),
                     CheckpointAndBleu(store, None, None, 0, model_dir, chief=False)]
    early = (EarlyStopping(run.early_stopping, model_dir, strategy if is_multi_worker(strategy) else None, chief)
             if run.early_stopping else None)
    budget = (TimeBudget(run.max_minutes * 60, started, strategy if is_multi_worker(strategy) else None)
              if run.max_minutes else None)
    callbacks.extend(callback for callback in (early, budget) if callback)
    return callbacks, budget, early


def _stopped_early(run, model_dir, start_step) -> dict | None:
    """Where an earlier part of the run stopped early (`--early-stopping`: its `history.csv` up
    to `start_step` shows as many rounds without a lower validation loss), said in the log, as
    results.json's `stopped_early`; None when training goes on."""
    if not run.early_stopping or not start_step or start_step >= run.steps:
        return None
    rounds, best = rounds_without_improvement(run_dir.read_history(model_dir), up_to_step=start_step)
    if rounds < run.early_stopping:
        return None
    log.info("the run stopped early at step %d (the validation loss has not improved for %d checkpoints since "
             "step %d): nothing to train; it is averaged and evaluated as it is", start_step, rounds, best)
    return {"step": start_step, "best_step": best, "patience": run.early_stopping}


def _train(run, model, data, callbacks, start_step, store, progress, signals, budget, strategy, early=None):
    """`fit` in rounds until the step count or the time budget, with stop signals
    watched. Returns None, or the step at which a signal stopped it (a checkpoint of
    that step written); a non-finite loss raises `NonFiniteLossError` naming the
    newest good checkpoint."""
    with signals:
        try:
            _fit_rounds(model, data.train, data.valid, callbacks, start_step, run.steps, run.checkpoint_every,
                        stopped=lambda: bool(budget and budget.exhausted) or bool(early and early.stopped),
                        accumulate=run.accumulate)
            if any_worker(strategy, bool(signals.received)):  # arrived during the last round's checkpoint
                raise Interrupted(signals.received or "a stop signal on another worker")
        except Interrupted:
            progress.end_live_line()
            step = int(model.optimizer.iterations.numpy())
            newest = store.paths[-1] if store.paths else ""
            path = newest if newest.endswith(f"-{step}") else store.save(step)
            print(f"stopped at step {step} of {run.steps} ({signals.received}); checkpoint "
                  f"{os.path.basename(path)} written. Run the same command again to resume.", flush=True)
            return step
        except tf.errors.ResourceExhaustedError as error:
            progress.end_live_line()
            raise run_dir.RunError(_out_of_memory(run, int(model.optimizer.iterations.numpy()), store, error)) from None
        except NonFiniteLossError as error:
            progress.end_live_line()
            newest = store.paths[-1] if store.paths else None
            kept = (f"the newest checkpoint is still {os.path.basename(newest)} (finite weights)" if newest
                    else "no checkpoint was written")
            raise NonFiniteLossError(f"{error}; training stopped and {kept}. Lower the learning rate "
                                     f"(--config's warmup_steps) or check the data, then rerun to "
                                     f"resume from the last checkpoint") from None
    return None


def _out_of_memory(run, step, store, error) -> str:
    """The one line for a device out of memory in training (`ResourceExhaustedError` from
    `fit`: a training or validation batch too big for the GPU; the BLEU passes halve their own
    batches, `evaluation.compute_bleu`): where it stopped, what is kept, and the flags that
    keep each update's tokens with smaller batches."""
    what = out_of_memory_reason(error)
    newest = os.path.basename(store.paths[-1]) if store.paths else None
    advice = (f"rerun with --batch-tokens {max(run.batch_tokens // 2, 1)} --accumulate {run.accumulate * 2}"
              f"{'' if newest is None else f' to resume from {newest}'}: each update keeps its "
              f"{run.batch_tokens * run.accumulate} tokens in batches half as big")
    return (f"out of memory in training at step {step} with --batch-tokens {run.batch_tokens} ({what}); "
            f"{'no checkpoint was written' if newest is None else f'the newest checkpoint is {newest}'}: {advice}")


def _leave_worker(model, config, tokenizer, model_dir, worker_dir, strategy) -> TrainedRun:
    """A multi-worker non-chief's end: its own checkpoint directory removed."""
    import shutil

    step = int(model.optimizer.iterations.numpy())
    shutil.rmtree(worker_dir, ignore_errors=True)
    print(f"worker {strategy.cluster_resolver.task_id}: trained to step {step}; the chief averages, "
          f"evaluates and exports", flush=True)
    return TrainedRun(model, config, tokenizer, {"steps": step}, model_dir, chief=False)


def _average(run, model, config, store, model_dir, started, budget, trained_before=0.0, start_step=0) -> dict:
    """Averages the last `run.average` round checkpoints into `model`, saves them as the
    final weights; returns the run's figures so far (`train_minutes`: this process's and
    `trained_before`, the parts' before it; only `trained_before` when this process trained
    no step, a rerun of a finished or early-stopped run, which once added its own start-up,
    averaging and evaluation each time)."""
    from keras_transformer.training.checkpoints import average_checkpoints

    averaged = averaged_checkpoints(store, run.checkpoint_every, run.steps, run.average)
    log.info("averaging %d checkpoint(s): %s", len(averaged), ", ".join(os.path.basename(p) for p in averaged))
    average_checkpoints(model, averaged)
    run_dir.save_final_weights(model, config, model_dir)
    steps = int(model.optimizer.iterations.numpy())
    minutes = trained_before + ((time.time() - started) / 60 if steps != start_step else 0.0)
    results = {"steps": steps, "averaged_checkpoints": len(averaged), "train_minutes": round(minutes, 2)}
    if hasattr(model.optimizer, "skipped_steps"):  # mixed_float16: steps skipped by loss scaling
        results["skipped_steps"] = int(model.optimizer.skipped_steps.numpy())
    if budget and budget.exhausted:
        results["stopped_by_time_budget"] = run.max_minutes
    return results


def _float32_model(config, tokenizer, model_dir):
    """`(model, translator)` in float32 from the run's final weights, for a run trained
    under mixed precision, which is a training speed choice: its BLEU and its export
    are then those of the model `load_trained` and `export.saved_model --model-dir` build
    from the same weights. (In bfloat16 compute the export's `translate_xla` and
    `serving_default` round differently and chose other words for 3 of 40 toy
    sentences, and its BLEU would depend on how it was loaded.)"""
    keras.mixed_precision.set_global_policy("float32")  # (`train_and_evaluate` restores the caller's)
    model = run_dir.final_model(model_dir, config)  # as `load_trained` builds it
    return model, Translator(model, config, tokenizer.model_bytes)


def _evaluate(run, translator, data, model_dir) -> dict:
    """Beam-search BLEU of the averaged model on valid and every test set (`test` when
    there is one, each by its own name, test2016, test2017, ..., when a directory holds
    several); hypotheses written beside the run."""
    results = {}
    for split in ["valid"] * ("valid" in data.splits) + sorted(s for s in data.splits if s.startswith("test")):
        score, signature, hyps = compute_bleu(translator, data.pairs(split), beam_size=run.beam_size)
        results[f"{split}_bleu"] = round(score.score, 2)
        results["bleu_signature"] = signature
        run_dir.hypothesis_path(model_dir, split).write_text("\n".join(hyps) + "\n", encoding="utf-8")
        print(f"{split} BLEU (beam {run.beam_size}, averaged model) = {score.score:.2f}  [{signature}]",
              flush=True)
    return results
