"""Fine-tuning (`train.py --init-from DIR`, `TrainingConfig.init_from`): the finished run
whose averaged weights, tokenizer and model a new run starts from, checked before anything
is written, and how its weights, tokenizer and config reach the new run. The optimizer and
the schedule of the new run start afresh (`training.run` builds them as for any run)."""

from __future__ import annotations

import logging
import pathlib

from keras_transformer import run_dir
from keras_transformer.config import ConfigError

log = logging.getLogger("keras_transformer.training")


def initial_run(run, model_dir):
    """The finished run whose weights this one starts from (`--init-from`), as `(directory,
    config)`, or `(None, None)` for a run from scratch. A new run reads it from the flag, after
    checking that the directory holds a finished run (run.json, tokenizer.model, final weights)
    before anything is written; a resumed run from its run.json (the flag may then be left out;
    the initial run is no longer read), and refuses a flag naming another initial run."""
    given = pathlib.Path(run.init_from).resolve() if run.init_from else None
    if given is not None and given == model_dir.resolve():
        raise run_dir.RunError(f"--init-from {run.init_from} is the --model-dir itself: to resume the run there, "
                               f"leave out --init-from")
    if (model_dir / run_dir.RUN_FILE).exists():  # a run resumed: it started from what its run.json says
        recorded = run_dir.read_run_file(model_dir).get("init_from")
        if given is not None and (recorded is None or pathlib.Path(recorded) != given):
            began = "trained from scratch" if recorded is None else f"started from {recorded}"
            raise run_dir.RunError(f"{model_dir} holds a run {began}, not from {given}: leave out --init-from to "
                                   f"resume it, or use a new --model-dir")
        if recorded is None:
            return None, None
        log.info("the run started from the weights of %s (run.json)", recorded)
        return pathlib.Path(recorded), run_dir.load_config(model_dir)
    if given is None:
        return None, None
    from keras_transformer.data import Tokenizer, tokenizer_path

    try:
        config = run_dir.load_config(given)
    except run_dir.RunError as error:  # not a run directory
        raise run_dir.RunError(f"--init-from {run.init_from}: {error}") from None
    fine_tuning_config(run, config.vocab_size, config, given)  # a --set it refuses: before anything is written
    if not tokenizer_path(given).exists():
        raise run_dir.RunError(f"--init-from {run.init_from}: {tokenizer_path(given)} not found; the initial run's "
                               f"tokenizer is this run's")
    run_dir.check_run_tokenizer(given, Tokenizer.load(tokenizer_path(given)))
    if not (given / run_dir.FINAL_WEIGHTS).exists():
        raise run_dir.RunError(f"--init-from {run.init_from}: {given / run_dir.FINAL_WEIGHTS} not found: that run has "
                               f"not finished (train.py writes its averaged weights when training ends); run its "
                               f"command again to finish it")
    return given, config


def fine_tuning_config(run, vocab_size, start, init_from):
    """`run.model_config(vocab_size, start)`, a `--set` of a field that the initial run's
    weights fix refused in one line naming --init-from."""
    try:
        return run.model_config(vocab_size, start)
    except ConfigError as error:
        if init_from is None:
            raise
        reason = str(error).removeprefix("init_from: ")
        raise run_dir.RunError(f"--init-from {run.init_from or init_from}: {reason}") from None


def take_tokenizer(init_from, model_dir) -> None:
    """Copies the initial run's tokenizer into a fine-tuning run's directory (a copy already
    there must be that one: its pieces are the ids the weights were trained on). A resumed
    run has its copy, and the initial run may be gone by then (run.json checks the copy)."""
    from keras_transformer.atomic_writes import write_bytes_atomically
    from keras_transformer.data import tokenizer_path

    source, target = tokenizer_path(init_from), tokenizer_path(model_dir)
    if not target.exists():
        write_bytes_atomically(target, source.read_bytes())
        log.info("tokenizer: %s's, copied to %s", source, target)
    elif source.exists() and target.read_bytes() != source.read_bytes():
        raise run_dir.RunError(f"{target} is not the tokenizer of {init_from}, whose weights --init-from starts "
                               f"from (their ids are its pieces): remove it, or use a new --model-dir")


def initialize_from(model, init_from) -> None:
    """Sets `model`'s weights to the initial run's final (averaged) weights; the optimizer
    (Adam's moments, the step of the schedule) stays new."""
    source = run_dir.final_model(init_from, run_dir.load_config(init_from))
    model.set_weights(source.get_weights())
    log.info("weights: %s (the initial run's averaged weights); optimizer and schedule from step 0",
             init_from / run_dir.FINAL_WEIGHTS)
