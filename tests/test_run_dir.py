"""A run directory's files: the history written atomically, and what a resumed run reads back."""

import pytest


def test_history_append_is_atomic_and_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    """Issue #19: history.csv was appended in place (a full disk could leave half a row).
    It is rewritten beside itself and renamed; a failed write is a one-line RunError and
    the previous file is byte for byte unchanged (csv's \\r\\n line ends included)."""
    import errno
    import pathlib

    from keras_transformer import run_dir

    run_dir.append_history(tmp_path, {"step": 10, "loss": "3.0000"})
    run_dir.append_history(tmp_path, {"step": 20, "loss": "2.5000", "bleu": "12.00"})
    path = tmp_path / run_dir.HISTORY_FILE
    before = path.read_bytes()
    assert before.count(b"\r\n") == 3 and before.startswith(b"step,loss,")
    assert [(r["step"], r["loss"], r["bleu"]) for r in run_dir.read_history(tmp_path)] == [
        ("10", "3.0000", ""), ("20", "2.5000", "12.00")]

    real_open = pathlib.Path.open

    def full_disk(self, mode="r", *args, **kwargs):
        if self.name.endswith(".tmp") and "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", full_disk)
    with pytest.raises(run_dir.RunError, match="^cannot write .*history.csv: No space left on device; the "
                                               "previous version is unchanged"):
        run_dir.append_history(tmp_path, {"step": 30, "loss": "2.0000"})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [run_dir.HISTORY_FILE]


def test_a_resumed_run_goes_on_from_the_minutes_of_its_last_row_at_or_before_its_step(tmp_path):
    """`run_dir.minutes_before(step)`: the `minutes` of history.csv's last row at or before
    `step` (a signal's mid-round checkpoint falls between rows), skipping rows that did not
    measure them; 0.0 before the first row, and for a run without history."""
    from keras_transformer import run_dir

    assert run_dir.minutes_before(tmp_path, 40) == 0.0
    for step, minutes in ((10, "1.50"), (20, "3.25"), (30, ""), (40, "7.00")):
        run_dir.append_history(tmp_path, {"step": step, "loss": "2.0000", "minutes": minutes})
    assert [run_dir.minutes_before(tmp_path, step) for step in (5, 10, 17, 20, 30, 36, 40, 45)] == [
        0.0, 1.5, 1.5, 3.25, 3.25, 3.25, 7.0, 7.0]


def test_a_damaged_model_directory_is_a_one_line_error(tmp_path, capsys):
    """A --model-dir that is a file, a truncated run.json and a corrupt final.weights.h5 were
    tracebacks (FileExistsError, JSONDecodeError, h5py's OSError) from train.py, export.saved_model
    and export.ctranslate2: each is now a RunError naming the file, and the commands print one line."""
    from export import ctranslate2, saved_model
    from keras_transformer import TransformerConfig, run_dir
    from keras_transformer.data import Tokenizer, tokenizer_path, train_tokenizer

    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(run_dir.RunError, match=r"^--model-dir .*a-file exists and is not a directory"):
        run_dir.make_model_dir(tmp_path / "a-file")
    with pytest.raises(run_dir.RunError, match=r"^--model-dir .*a-file/run cannot be created"):
        run_dir.make_model_dir(tmp_path / "a-file" / "run")
    assert run_dir.make_model_dir(tmp_path / "new" / "run").is_dir()

    model_dir = tmp_path / "run"
    texts = ["the man sees the dog", "der Mann sieht den Hund", "a red house", "ein rotes Haus"] * 30
    tokenizer = Tokenizer.load(train_tokenizer(texts, tokenizer_path(model_dir).with_suffix(""), 40))
    config = TransformerConfig.from_preset("tiny", vocab_size=tokenizer.vocab_size)
    run_dir.check_run_file(model_dir, config, tokenizer, {"data": "toy"})
    assert run_dir.load_config(model_dir) == config

    # Weights that are not HDF5 (a copy cut short): load_trained names the file.
    (model_dir / run_dir.FINAL_WEIGHTS).write_bytes(b"not an HDF5 file")
    with pytest.raises(run_dir.RunError, match=r"final\.weights\.h5 cannot be loaded into the model run\.json "
                                               r"describes \(.*\); rerun train\.py"):
        run_dir.load_trained(model_dir)
    for name, main in (("export.saved_model", saved_model.main), ("export.ctranslate2", ctranslate2.main)):
        assert main(["--model-dir", str(model_dir), "--output", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"{name}: error: ") and "final.weights.h5" in err[0], err
        assert not (tmp_path / name).exists() or not any((tmp_path / name).iterdir())

    # run.json cut short: every reader says which file and what to do.
    record = (model_dir / run_dir.RUN_FILE).read_text()
    (model_dir / run_dir.RUN_FILE).write_text(record[:len(record) // 2])
    damaged = r"run\.json is not valid JSON \(.*\); train\.py writes it atomically"
    for read in (lambda: run_dir.load_config(model_dir),
                 lambda: run_dir.check_run_file(model_dir, config, tokenizer, {"data": "toy"}),
                 lambda: run_dir.check_run_tokenizer(model_dir, tokenizer)):
        with pytest.raises(run_dir.RunError, match=damaged):
            read()
    assert ctranslate2.main(["--model-dir", str(model_dir), "--output", str(tmp_path / "ct2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run.json is not valid JSON" in err[0], err
    (model_dir / run_dir.RUN_FILE).write_text('{"data": "toy"}')
    with pytest.raises(run_dir.RunError, match=r"run\.json records no model config"):
        run_dir.load_config(model_dir)


def test_exports_can_average_the_newest_checkpoints_instead_of_the_final_weights(tmp_path, monkeypatch, capsys):
    """`load_trained(model_dir, average=K)` and the exports' `--average K`: the mean of the
    run's newest K checkpoints (a run still training has no final.weights.h5), checked on
    checkpoints whose weights are all 1, 2 and 4."""
    import numpy as np

    from export import ctranslate2, saved_model
    from keras_transformer import TransformerConfig, build_transformer, make_optimizer, run_dir
    from keras_transformer.training.checkpoints import CheckpointStore
    from keras_transformer.data import Tokenizer, tokenizer_path, train_tokenizer

    model_dir = tmp_path / "run"
    texts = ["the man sees the dog", "der Mann sieht den Hund", "a red house", "ein rotes Haus"] * 30
    tokenizer = Tokenizer.load(train_tokenizer(texts, tokenizer_path(model_dir).with_suffix(""), 40))
    config = TransformerConfig.from_preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=1, d_model=32,
                                           d_ff=64)
    run_dir.check_run_file(model_dir, config, tokenizer, {"data": "toy"})
    with pytest.raises(run_dir.RunError, match=r"checkpoints: no checkpoints to average"):
        run_dir.load_trained(model_dir, average=2)
    with pytest.raises(run_dir.RunError) as no_checkpoint:  # nothing to export at all
        run_dir.load_trained(model_dir)
    assert str(no_checkpoint.value) == (f"{model_dir / 'final.weights.h5'} not found: train.py writes it (the "
                                        f"averaged checkpoints) when training ends")
    model = build_transformer(config)
    optimizer = make_optimizer(config)
    optimizer.build(model.trainable_variables)
    store = CheckpointStore(model_dir / run_dir.CHECKPOINT_DIR, model, optimizer, tokenizer.sha256)
    for step, value in ((10, 1.0), (20, 2.0), (30, 4.0)):
        model.set_weights([np.full_like(w, value) for w in model.get_weights()])
        store.save(step)

    def values(loaded):
        return sorted({float(x) for w in loaded.get_weights() for x in np.unique(w)})

    for count, mean in ((1, 4.0), (2, 3.0), (3, 7 / 3), (9, 7 / 3)):  # 9: all that are kept
        loaded, _, _ = run_dir.load_trained(model_dir, average=count)
        assert values(loaded) == [pytest.approx(mean, abs=1e-6)], count
    assert run_dir.checkpoint_model(model_dir, config, tokenizer, 2)[1] == ["ckpt-20", "ckpt-30"]
    with pytest.raises(run_dir.RunError) as missing:
        run_dir.load_trained(model_dir)  # without --average: the final weights, which a running run lacks
    # ... and the message says what can be exported instead (it named only train.py)
    assert str(missing.value) == (f"{model_dir / 'final.weights.h5'} not found: train.py writes it (the averaged "
                                  f"checkpoints) when training ends; the run's newest checkpoint is ckpt-30: "
                                  f"`--average K` of export.saved_model and export.ctranslate2 exports the mean "
                                  f"of its newest K")

    # The commands pass --average through (their conversions replaced by a probe of the model).
    converted = []
    monkeypatch.setattr(saved_model, "export_model", lambda model, *args, **kwargs: converted.append(values(model)))
    monkeypatch.setattr(ctranslate2, "convert", lambda model, *args, **kwargs: converted.append(values(model)))
    for main in (saved_model.main, ctranslate2.main):
        assert main(["--model-dir", str(model_dir), "--output", str(tmp_path / "out"), "--average", "2"]) == 0
        assert capsys.readouterr().err == f"{main.__module__}: averaged 2 checkpoint(s): ckpt-20, ckpt-30\n"
        # more than the run keeps: all three, and the command says so (it had said nothing)
        assert main(["--model-dir", str(model_dir), "--output", str(tmp_path / "out"), "--average", "9"]) == 0
        assert capsys.readouterr().err == (f"{main.__module__}: averaged 3 checkpoint(s): ckpt-10, ckpt-20, ckpt-30 "
                                           f"(9 asked; the run keeps 3)\n")
        with pytest.raises(SystemExit):
            main(["--model-dir", str(model_dir), "--output", str(tmp_path / "out"), "--average", "0"])
        assert "--average must be a positive integer, got 0" in capsys.readouterr().err
    assert converted == [[pytest.approx(3.0, abs=1e-6)], [pytest.approx(7 / 3, abs=1e-6)]] * 2

    # a checkpoint of another tokenizer is refused, as resuming refuses it
    other = Tokenizer.load(train_tokenizer(texts[::-1] + ["other words"] * 20, tmp_path / "other" / "tok", 40))
    with pytest.raises(run_dir.RunError, match=r"ckpt-30 was trained with a tokenizer of sha256"):
        run_dir.checkpoint_model(model_dir, config, other, 1)


def test_final_weights_hold_the_model_only_and_a_full_disk_is_refused_before_writing(tmp_path, monkeypatch):
    """final.weights.h5 held the compiled model's Adam moments too (3x the file: 12.8 MB for
    `tiny`, read by nothing). On a disk with too little space h5py's failed write left a
    truncated file, a traceback per freed object and a SIGSEGV at exit: the space is now
    checked first, and a write that fails anyway leaves no file."""
    import collections
    import pathlib

    import h5py
    import keras
    import numpy as np

    from keras_transformer import TransformerConfig, build_transformer, make_optimizer, run_dir

    config = TransformerConfig(vocab_size=30, num_layers=1, d_model=8, d_ff=16, num_heads=2)
    model = build_transformer(config)
    model.compile(optimizer=make_optimizer(config), loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    for v in model.optimizer.variables:
        v.assign(np.full(v.shape, 7, v.dtype))
    weights = [np.random.default_rng(i).normal(size=w.shape).astype(w.dtype) for i, w in enumerate(model.weights)]
    model.set_weights(weights)
    path = run_dir.save_final_weights(model, config, tmp_path)
    with h5py.File(path) as f:
        assert "optimizer" not in f
    loaded = run_dir.final_model(tmp_path, config)
    for got, want in zip(loaded.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(got, want)
    assert sorted(p.name for p in tmp_path.iterdir()) == [run_dir.FINAL_WEIGHTS]
    before = path.read_bytes()

    usage = collections.namedtuple("usage", "total used free")
    data = sum(w.nbytes for w in weights)
    monkeypatch.setattr(run_dir.shutil, "disk_usage", lambda p: usage(2**30, 2**30, data + 2**20 - 1))
    with pytest.raises(run_dir.RunError, match=r"^cannot write .*final\.weights\.h5: it needs 1\.\d MiB and its "
                                               r"disk has 1\.\d MiB free; the checkpoints are complete\. Free space"):
        run_dir.save_final_weights(model, config, tmp_path)
    monkeypatch.undo()

    def full_disk(self, filepath, *args, **kwargs):  # what gets past the check: a write that fails midway
        pathlib.Path(filepath).write_bytes(b"HDF5 cut short")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(keras.Model, "save_weights", full_disk)
    with pytest.raises(run_dir.RunError, match=r"^cannot write .*final\.weights\.h5: No space left on device; "):
        run_dir.save_final_weights(model, config, tmp_path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [run_dir.FINAL_WEIGHTS] and path.read_bytes() == before

    # SIGTERM midway (`kill PID`, a scheduler's preemption) had ended the process at once, leaving
    # `.final.tmp-PID.weights.h5`, a new one at each such stop; now it is removed, as for Ctrl-C.
    from helpers import sigterm_self
    from keras_transformer.console import Terminated

    def terminated(self, filepath, *args, **kwargs):
        pathlib.Path(filepath).write_bytes(b"HDF5 cut short")
        sigterm_self()

    monkeypatch.setattr(keras.Model, "save_weights", terminated)
    with pytest.raises(Terminated):
        run_dir.save_final_weights(model, config, tmp_path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [run_dir.FINAL_WEIGHTS] and path.read_bytes() == before
