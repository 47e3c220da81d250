"""TrainingConfig and TransformerConfig: presets, `--set`, each option defined once
(the parser, the README table, errors naming the flag)."""

import dataclasses
import pathlib

import pytest

from keras_transformer.config import (PRESETS, SYNTAX_FIELDS, TRAINING_DEFAULTS, ConfigError, TrainingConfig,
                                      TransformerConfig, command_line_options, options_table)


def test_training_config_defaults_come_from_the_preset():
    tiny = TrainingConfig.create("tiny")
    assert (tiny.steps, tiny.batch_tokens, tiny.checkpoint_every, tiny.average, tiny.keep_checkpoints,
            tiny.beam_size, tiny.vocab_size) == (600, 2048, 60, 5, 5, 4, 1000)
    big = TrainingConfig.create("big", steps=1000)
    assert (big.batch_tokens, big.checkpoint_every, big.average, big.keep_checkpoints) == (25000, 100, 20, 20)
    assert TrainingConfig.create("big", steps=1000, keep_checkpoints=30).keep_checkpoints == 30
    # Issue #19: fewer checkpoints kept than averaged was raised to the average without a word.
    with pytest.raises(ValueError, match="^keep_checkpoints=3 is below average=20: the last 20 checkpoints"):
        TrainingConfig.create("big", steps=1000, keep_checkpoints=3)
    # ...and a batch that cannot hold one longest pair was a traceback from the batching code.
    with pytest.raises(ValueError, match="^batch_tokens=32 cannot hold one pair of max_length=64 tokens"):
        TrainingConfig.create("tiny", batch_tokens=32)
    assert TrainingConfig.create("tiny", batch_tokens=32, max_length=32).batch_tokens == 32
    assert TrainingConfig.create("base").steps == 100_000
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        TrainingConfig.create("huge")
    with pytest.raises(ValueError, match="^steps must be a positive integer, got 0$"):
        TrainingConfig.create("tiny", steps=0)


def test_multi30k_recipe_preset():
    run = TrainingConfig.create("multi30k")
    # Issue #17: the whole hour (56 training minutes; averaging, BLEU and export in the rest),
    # the step count only a cap.
    assert (run.batch_tokens, run.checkpoint_every, run.average, run.max_minutes, run.vocab_size,
            run.steps) == (4096, 250, 10, 56.0, 10_000, 40_000)  # 10,000 pieces chosen on valid (#17)
    assert (run.keep_checkpoints, run.beam_size) == (10, 5)  # decoding chosen on valid (issue #17)
    config = run.model_config(run.vocab_size)
    assert (config.num_layers, config.d_model, config.d_ff, config.num_heads, config.dropout,
            config.warmup_steps) == (2, 128, 512, 4, 0.2, 200)
    assert (config.beam_size, config.length_penalty_alpha, config.checkpoints_to_average) == (5, 1.0, 10)
    assert TrainingConfig.create("multi30k", max_minutes=5, checkpoint_every=50).max_minutes == 5
    assert TrainingConfig.create("tiny").max_minutes == 0
    with pytest.raises(ValueError, match="^max_minutes must be >= 0, got -1$"):
        TrainingConfig.create("tiny", max_minutes=-1)
    assert TransformerConfig.from_preset("multi30k").max_length == 64


def test_a_runs_config_records_its_own_steps_and_average():
    """`--steps`/`--average` are the run's; its model config (logged at the start, saved in
    run.json and the export) says them, not the preset's 40,000 steps and 10 checkpoints."""
    import train

    run = train.parse_args(["--config", "multi30k", "--steps", "10750", "--average", "3"]).run
    config = run.model_config(10_000)
    assert (config.train_steps, config.checkpoints_to_average) == (10_750, 3)
    assert config == TransformerConfig.from_preset("multi30k", vocab_size=10_000, train_steps=10_750,
                                                   checkpoints_to_average=3)
    assert "train_steps=10750" in repr(config) and "checkpoints_to_average=3" in repr(config)


def test_a_fine_tuning_runs_model_is_the_initial_runs_with_its_own_training_fields():
    """`--init-from`: the model config is the initial run's (not the preset's), with the run's
    steps, average, --max-length and the `FINE_TUNING_FIELDS` it sets; a field that the
    initial weights fix, set to another value, is a ConfigError naming it and its value."""
    import train

    from keras_transformer.config import FINE_TUNING_FIELDS

    start = TransformerConfig.from_preset("multi30k", vocab_size=8000, num_layers=3, source_tags=("upos",),
                                          train_steps=40_000, checkpoints_to_average=10)
    run = train.parse_args(["--init-from", "runs/a", "--steps", "500", "--average", "2", "--max-length", "80",
                            "--set", "dropout=0.3", "--set", "learning_rate_scale=0.5",
                            "--set", "warmup_steps=50", "--set", "num_layers=3"]).run
    assert run.init_from == "runs/a" and run.preset == "tiny"
    config = run.model_config(8000, start)
    assert config == dataclasses.replace(start, train_steps=500, checkpoints_to_average=2, max_length=80,
                                         dropout=0.3, learning_rate_scale=0.5, warmup_steps=50)
    assert run.model_config(8000) != config  # without a start: tiny's model
    assert set(FINE_TUNING_FIELDS) >= {"dropout", "learning_rate_scale", "train_steps", "max_length"}
    assert not set(FINE_TUNING_FIELDS) & {"num_layers", "d_model", "d_ff", "num_heads", "vocab_size",
                                          "norm_first", "source_tags", "syntax_attention"}
    for settings, syntax, vocab, message in [
            ({"num_layers": 4, "d_ff": 256}, {}, 8000, "num_layers=4 (it has 3), d_ff=256 (it has 512)"),
            ({}, {"syntax_attention": "hard"}, 8000, "syntax_attention='hard' (it has 'none')"),
            ({}, {}, 9000, "vocab_size=9000 (it has 8000)")]:
        with pytest.raises(ConfigError) as error:
            TrainingConfig.create("tiny", init_from="runs/a", model=settings, syntax=syntax).model_config(vocab, start)
        assert error.value.field == "init_from"
        assert str(error.value).startswith(f"init_from: the model is the initial run's, so {message} cannot be set; "
                                           f"a fine-tuning run may set dropout, ")
    with pytest.raises(ConfigError, match="^init_from must be a run directory, got ' '$"):
        TrainingConfig.create("tiny", init_from=" ")


def test_set_flag_changes_model_fields_and_names_bad_ones(capsys):
    """train.py --set FIELD=VALUE: each value read as its field's type, on top of the preset
    (its beam becomes the run's BLEU beam); a bad one is a one-line error naming it."""
    import train

    run = train.parse_args(["--config", "multi30k", "--set", "dropout=0.3", "--set", "num_layers=4",
                            "--set", "d_ff=256", "--set", "norm_first=true", "--set", "beam_size=5"]).run
    assert run.model == {"dropout": 0.3, "num_layers": 4, "d_ff": 256, "norm_first": True, "beam_size": 5}
    config = run.model_config(8000)
    assert (config.num_layers, config.d_ff, config.dropout, config.norm_first, config.beam_size,
            config.d_model, config.warmup_steps) == (4, 256, 0.3, True, 5, 128, 200)
    assert run.beam_size == 5
    assert train.parse_args(["--config", "multi30k"]).run.model_config(10_000) == TransformerConfig.from_preset(
        "multi30k", vocab_size=10_000)
    for flags, message in [
            (["--set", "dropout=1.5"], "--set: TransformerConfig.dropout must be in [0, 1), got 1.5"),
            (["--set", "dropout=high"], "--set 'dropout=high': dropout takes a float"),
            (["--set", "vocab_size=9"], "--set 'vocab_size=9': expected FIELD=VALUE with FIELD one of num_layers"),
            (["--set", "num_heads=3"], "--set: num_heads=3 does not divide d_model=128"),
            # the field in error is not the one set, and has no flag of its own ("--num_heads=4 ...")
            (["--set", "d_model=130"], "train.py: error: --set: num_heads=4 does not divide d_model=130"),
            (["--set", "norm_first=maybe"], "--set 'norm_first=maybe': norm_first takes a bool")]:
        with pytest.raises(SystemExit) as exit_:
            train.parse_args(flags)
        assert exit_.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines
    with pytest.raises(ValueError, match=r"model: \['max_length'\] cannot be set this way"):
        TrainingConfig.create("tiny", model={"max_length": 32})


def test_the_docs_option_table_is_the_generated_one():
    """Issue #18: each option is defined once (on its config field); the docs' table
    (docs/reference/options.md) is made from those definitions. Regenerate the page with
    `python -m tools.reference`."""
    page = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "reference" / "options.md").read_text(
        encoding="utf-8")
    table = page.split("<!-- options:begin -->\n", 1)[1].split("\n<!-- options:end -->", 1)[0]
    assert table == options_table()


def test_readme_names_the_python_versions_pyproject_allows():
    """README's install section said "Python 3.11 or newer" while the pinned TensorFlow 2.21 has no wheels for
    3.14; `requires-python` now bounds it. The versions the Set-up's first sentence names are the
    ones that bound admits, so one cannot move without the other."""
    import re
    import tomllib

    from packaging.specifiers import SpecifierSet

    root = pathlib.Path(__file__).resolve().parents[1]
    allowed = SpecifierSet(tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
                           ["project"]["requires-python"])
    setup = (root / "README.md").read_text(encoding="utf-8").split("## Install\n\n", 1)[1]
    first_sentence = setup.split(":", 1)[0]  # "Python 3.11, 3.12 or 3.13"
    named = re.findall(r"\b3\.(\d+)\b", first_sentence)
    assert [int(minor) for minor in named] == [minor for minor in range(8, 20) if f"3.{minor}" in allowed]


def test_every_test_the_documents_name_is_a_test_where_they_say():
    """The README and the docs (troubleshooting's rows, the benchmarks) name the tests behind what they
    claim; two README rows named tests that had been renamed since
    (`test_sigkill_after_first_checkpoint_then_resume`, `test_sigterm_checkpoints_exits_0_and_resumes`).
    Each `[tests/]FILE::test_name` is a test function of that file, each bare `test_name` one of tests/.
    The lab notebook (docs/lab-notebook/) is a dated archive, kept as it was written."""
    import re

    root = pathlib.Path(__file__).resolve().parents[1]
    sources = {path.relative_to(root / "tests").as_posix(): path.read_text(encoding="utf-8")
               for path in (root / "tests").rglob("test_*.py")}
    checked = 0
    documents = [root / "README.md", *sorted(path for path in (root / "docs").rglob("*.md")
                                             if "lab-notebook" not in path.parts)]
    for path in documents:
        document = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        for file, name in re.findall(r"`(?:(?:tests/)?([\w/]+\.py)::)?(test_\w+)(?:\[[^\]`]*\])?`", text):
            where = {file: sources.get(file, "")} if file else sources
            assert any(re.search(rf"^def {name}\(", source, re.M) for source in where.values()), (
                f"{document} names {file + '::' if file else ''}{name}, which is no test there")
            checked += 1
    assert checked > 50


def test_options_cover_every_field_and_show_each_presets_default(capsys):
    """Every TrainingConfig field is a flag (syntax and model through their own flags),
    with its help and, where the presets differ, each preset's default as `create` makes it."""
    import dataclasses

    import train

    options = {item.field: item for item in command_line_options()}
    fields = {f.name for f in dataclasses.fields(TrainingConfig)} - {"syntax", "model"}
    assert set(options) == fields | set(SYNTAX_FIELDS)
    assert all(item.help for item in options.values())
    steps = options["steps"].default
    for preset, config in PRESETS.items():
        assert f"{preset} {config.train_steps}" in steps, steps
    assert options["max_minutes"].default == f"0 (multi30k {TRAINING_DEFAULTS['multi30k']['max_minutes']:g})"
    assert options["preset"].flag == "--config" and options["preset"].choices == tuple(PRESETS)
    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for item in options.values():
        assert item.flag in help_text
    assert f"(default: {options['steps'].default})" in help_text


@pytest.mark.parametrize("field", ["steps", "batch_tokens", "vocab_size", "max_length", "checkpoint_every",
                                   "keep_checkpoints", "average", "beam_size"])
def test_a_bad_value_names_its_flag_through_the_fields_config_error(field, capsys):
    """`ConfigError.field` names the field; train.py turns it into its flag, for every
    positive-integer option (no message parsing)."""
    import train

    flag = "--" + field.replace("_", "-")
    with pytest.raises(ConfigError) as error:
        TrainingConfig.create("tiny", **{field: 0})
    assert error.value.field == field
    with pytest.raises(SystemExit) as exit_:
        train.parse_args([flag, "0"])
    assert exit_.value.code == 2
    line = capsys.readouterr().err.strip()
    assert f"error: {flag} must be a positive integer, got 0" in line or f"error: {flag}: " in line, line


def test_subword_sampling_options(capsys):
    """--subword-alpha/--subword-nbest reach TrainingConfig; bad values and a syntax-aware model
    are one-line errors naming the flag."""
    import train

    run = train.parse_args(["--config", "multi30k", "--subword-alpha", "0.1", "--subword-nbest", "-1"]).run
    assert (run.subword_alpha, run.subword_nbest) == (0.1, -1)
    assert (TrainingConfig.create("multi30k").subword_alpha, TrainingConfig.create("multi30k").subword_nbest) == (0.0, 64)
    for flags, message in ((["--subword-alpha", "-0.5"], "--subword-alpha must be a finite number >= 0 (0: off), "
                                                          "got -0.5"),
                           (["--subword-alpha", "nan"], "--subword-alpha must be a finite number >= 0 (0: off), "
                                                        "got nan"),
                           (["--subword-nbest", "1"], "--subword-nbest must be -1 (all) or >= 2, got 1"),
                           (["--subword-alpha", "0.1", "--source-tags", "upos"],
                            "--subword-alpha cannot be used with a syntax-aware model")):
        with pytest.raises(SystemExit):
            train.parse_args(flags)
        assert message in capsys.readouterr().err


def test_num_decoder_layers_from_the_command_line(capsys):
    """train.py --set num_decoder_layers=N (a field whose default is None) reads an int;
    None keeps the paper's equal depths; a bad value is a one-line error naming it."""
    import train

    run = train.parse_args(["--config", "multi30k", "--set", "num_layers=3", "--set", "num_decoder_layers=1"]).run
    config = run.model_config(8000)
    assert (config.num_layers, config.num_decoder_layers, config.decoder_depth, config.depth_text) == (3, 1, 1, "3+1")
    plain = TransformerConfig.from_preset("multi30k")
    assert (plain.num_decoder_layers, plain.decoder_depth, plain.depth_text) == (None, 2, "2")
    assert TransformerConfig.from_dict({k: v for k, v in config.to_dict().items()}) == config
    for value in ("0", "one"):
        with pytest.raises(SystemExit):
            train.parse_args(["--config", "multi30k", "--set", f"num_decoder_layers={value}"])
        assert "num_decoder_layers" in capsys.readouterr().err
    with pytest.raises(ValueError, match="num_decoder_layers must be None or a positive integer, got True"):
        TransformerConfig.from_preset("multi30k", num_decoder_layers=True)


def test_a_write_that_fails_outside_the_checkpoints_is_one_line(monkeypatch, capsys):
    """A full disk while train.py wrote valid.hyp.txt or curves.png (plain file writes after
    the checkpoints) was an OSError traceback."""
    import train
    from keras_transformer.training import run as training

    def full_disk(run):
        raise OSError(28, "No space left on device", "runs/x/valid.hyp.txt")

    monkeypatch.setattr(training, "train_and_evaluate", full_disk)
    monkeypatch.setattr(train.console, "setup_logging", lambda verbose: None)  # the worker's logging stays as is
    assert train.main(["--model-dir", "runs/x", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["train.py: error: cannot write runs/x/valid.hyp.txt: No space left on device. Free space (or fix "
                   "the permissions) and rerun the same command: it resumes from the newest complete checkpoint"]


def test_nan_and_infinite_values_are_refused_where_they_broke_the_run(capsys):
    """Each check read `x < 0`, which NaN passes: `--set length_penalty_alpha=nan` trained a model
    whose beam search, the final BLEU's and the export's, gave "" for every sentence (every
    hypothesis scored NaN), `--max-minutes nan` trained without its budget, `--subword-alpha nan` was a
    ValueError traceback from the sampler, and `--set layer_norm_epsilon=nan` was not checked
    at all. Each is now the one-line error of its field."""
    import train

    for flags, message in (
            (["--set", "length_penalty_alpha=nan"], "length_penalty_alpha must be a finite number >= 0, got nan"),
            (["--set", "length_penalty_alpha=inf"], "length_penalty_alpha must be a finite number >= 0, got inf"),
            (["--set", "layer_norm_epsilon=nan"], "layer_norm_epsilon must be a positive number, got nan"),
            (["--set", "layer_norm_epsilon=0"], "layer_norm_epsilon must be a positive number, got 0"),
            (["--set", "learning_rate_scale=inf"], "learning_rate_scale must be a positive number, got inf"),
            (["--max-minutes", "nan"], "--max-minutes must be >= 0, got nan"),
            (["--subword-alpha", "inf"], "--subword-alpha must be a finite number >= 0 (0: off), got inf"),
            # not NaN, but the same kind of hole: NumPy's seeding raised its own traceback
            (["--seed", "-1"], "--seed must be an integer in [0, 2**32 - 1], got -1"),
            (["--seed", str(2 ** 32)], f"--seed must be an integer in [0, 2**32 - 1], got {2 ** 32}")):
        with pytest.raises(SystemExit) as stop:
            train.parse_args(flags)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, (flags, err)
    # the values that were right stay right
    assert TransformerConfig.from_preset("tiny", length_penalty_alpha=0.0, layer_norm_epsilon=1e-6)
    assert train.parse_args(["--max-minutes", "0", "--subword-alpha", "0"]).run.max_minutes == 0
    assert train.parse_args(["--seed", str(2 ** 32 - 1)]).run.seed == 2 ** 32 - 1
