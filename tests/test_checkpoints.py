"""Checkpoint store: resume state, tokenizer guard, averaging."""

import numpy as np
import pytest

from keras_transformer import TransformerConfig, build_transformer, make_optimizer
from keras_transformer.training.checkpoints import CheckpointError, CheckpointStore, average_checkpoints

CONFIG = TransformerConfig(vocab_size=30, num_layers=1, d_model=8, d_ff=16, num_heads=2)


def fresh():
    model = build_transformer(CONFIG)
    optimizer = make_optimizer(CONFIG)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def test_average_of_two_known_checkpoints_is_elementwise_mean(tmp_path):
    model, optimizer = fresh()
    store = CheckpointStore(tmp_path, model, optimizer, "hash")
    rng = np.random.default_rng(0)
    first = [rng.normal(size=w.shape).astype("float32") for w in model.get_weights()]
    second = [rng.normal(size=w.shape).astype("float32") for w in model.get_weights()]
    model.set_weights(first)
    store.save(1)
    model.set_weights(second)
    store.save(2)
    other, _ = fresh()
    average_checkpoints(other, store.paths)
    for got, a, b in zip(other.get_weights(), first, second):
        np.testing.assert_allclose(got, (a + b) / 2, atol=1e-6)


def test_restore_latest_brings_back_weights_optimizer_and_step(tmp_path):
    model, optimizer = fresh()
    store = CheckpointStore(tmp_path, model, optimizer, "hash", max_to_keep=2)
    for step in (10, 20, 30):
        optimizer.iterations.assign(step)
        model.set_weights([w + 1 for w in model.get_weights()])
        store.save(step)
    assert [p.rsplit("-", 1)[1] for p in store.paths] == ["20", "30"]  # keep last 2
    optimizer.variables[2].assign(optimizer.variables[2] + 5.0)  # an Adam moment
    optimizer.iterations.assign(40)
    store.save(40)
    want_weights = model.get_weights()
    want_moment = optimizer.variables[2].numpy()

    model2, optimizer2 = fresh()
    assert CheckpointStore(tmp_path, model2, optimizer2, "hash").restore_latest() == 40
    for got, want in zip(model2.get_weights(), want_weights):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(optimizer2.variables[2].numpy(), want_moment)


def test_unreadable_newest_checkpoint_falls_back_to_previous(tmp_path):
    model, optimizer = fresh()
    store = CheckpointStore(tmp_path, model, optimizer, "hash")
    optimizer.iterations.assign(5)
    store.save(5)
    optimizer.iterations.assign(9)
    newest = store.save(9)
    with open(newest + ".data-00000-of-00001", "wb") as f:
        f.write(b"truncated")
    model2, optimizer2 = fresh()
    assert CheckpointStore(tmp_path, model2, optimizer2, "hash").restore_latest() == 5


def test_other_tokenizer_is_refused(tmp_path):
    model, optimizer = fresh()
    CheckpointStore(tmp_path, model, optimizer, "a" * 64).save(1)
    with pytest.raises(CheckpointError, match="trained with a tokenizer of sha256 aaaaaaaaaaaa"):
        CheckpointStore(tmp_path, *fresh(), "b" * 64).restore_latest()


def test_empty_directory_starts_at_zero(tmp_path):
    assert CheckpointStore(tmp_path, *fresh(), "hash").restore_latest() == 0
    with pytest.raises(CheckpointError, match="no checkpoints to average"):
        average_checkpoints(fresh()[0], [])


def test_averaging_skips_an_unreadable_checkpoint_as_resuming_does(tmp_path, caplog):
    """Issue #19: a corrupt checkpoint among the last K made averaging raise a traceback."""
    model, optimizer = fresh()
    store = CheckpointStore(tmp_path, model, optimizer, "hash")
    rng = np.random.default_rng(1)
    saved = []
    for step in (1, 2, 3):
        saved.append([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
        model.set_weights(saved[-1])
        store.save(step)
    with open(store.paths[1] + ".data-00000-of-00001", "wb") as f:
        f.write(b"truncated")
    other, _ = fresh()
    with caplog.at_level("WARNING", logger="keras_transformer.training.checkpoints"):
        average_checkpoints(other, store.paths)
    for got, a, c in zip(other.get_weights(), saved[0], saved[2]):
        np.testing.assert_allclose(got, (a + c) / 2, atol=1e-6)  # the mean of the two readable ones
    assert "averaging 2 of 3 checkpoints: skipped unreadable ckpt-2" in caplog.text
    with open(store.paths[0] + ".index", "wb") as f:
        f.write(b"")
    with open(store.paths[2] + ".data-00000-of-00001", "wb") as f:
        f.write(b"")
    with pytest.raises(CheckpointError, match="^none of the 3 checkpoints to average can be read: ckpt-1"):
        average_checkpoints(other, store.paths)


def test_a_checkpoint_that_cannot_be_written_is_a_one_line_error(tmp_path, monkeypatch):
    """Issue #19: a full disk while checkpointing was a traceback. The error names the
    checkpoint, the reason and the newest complete one, which stays restorable."""
    import errno

    import tensorflow as tf

    model, optimizer = fresh()
    store = CheckpointStore(tmp_path, model, optimizer, "hash")
    optimizer.iterations.assign(5)
    store.save(5)

    (tmp_path / "ckpt-90.index").write_bytes(b"not ours")

    def full_disk(*args, **kwargs):  # as TensorFlow's save on a full disk: partial files, then the error
        (tmp_path / "ckpt-9_temp").mkdir()
        (tmp_path / "ckpt-9_temp" / "part-00000-of-00001.data-00000-of-00001.tempstate1").write_bytes(b"x" * 99)
        (tmp_path / "ckpt-9.index").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tf.train.CheckpointManager, "save", full_disk)
    with pytest.raises(CheckpointError, match=r"^cannot write checkpoint ckpt-9 in .*: No space left on device; "
                                              r"the newest complete checkpoint is still ckpt-5\. Free space"):
        store.save(9)
    monkeypatch.undo()
    # the failed save's files are gone (they took space on the full disk); the others stay
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint", "ckpt-5.data-00000-of-00001", "ckpt-5.index", "ckpt-90.index"]
    model2, optimizer2 = fresh()
    assert CheckpointStore(tmp_path, model2, optimizer2, "hash").restore_latest() == 5


def test_a_save_that_tensorflow_fails_mid_write_leaves_no_partial_files(tmp_path):
    """A real failed write (files capped below the checkpoint's size, as a full disk
    stops it): the error says the system's reason without TensorFlow's wrapping
    (`{{function_node __wrapped__SaveV2...}} .../ckpt-9_temp/part-...; File too large
    [Op:SaveV2]`), and the `ckpt-9_temp` directory TensorFlow left is removed."""
    import resource
    import signal

    model, optimizer = fresh()
    store = CheckpointStore(tmp_path, model, optimizer, "hash")
    optimizer.iterations.assign(5)
    store.save(5)
    size = (tmp_path / "ckpt-5.data-00000-of-00001").stat().st_size
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails with EFBIG
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, hard))
        with pytest.raises(CheckpointError) as error:
            store.save(9)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert str(error.value).startswith(f"cannot write checkpoint ckpt-9 in {tmp_path}: File too large; "
                                       "the newest complete checkpoint is still ckpt-5. Free space")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "ckpt-5.data-00000-of-00001",
                                                          "ckpt-5.index"]
    model2, optimizer2 = fresh()
    assert CheckpointStore(tmp_path, model2, optimizer2, "hash").restore_latest() == 5


def test_what_a_killed_save_left_is_removed_and_listed_checkpoints_are_kept(tmp_path):
    """A SIGKILL mid-save (by hand: `train.py` killed as `ckpt-20.index` appeared) left the files
    of a checkpoint the state file does not list, or `ckpt-N_temp/`. The chief removes them before
    it resumes; listed checkpoints, and unlisted files older than the newest listed one (a lost
    state file is no reason to delete checkpoints), stay."""
    import os
    import shutil

    model, optimizer = fresh()
    store = CheckpointStore(tmp_path, model, optimizer, "hash")
    for step in (5, 10):
        optimizer.iterations.assign(step)
        store.save(step)
    os.mkdir(tmp_path / "ckpt-9_temp")
    (tmp_path / "ckpt-9_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"partial")
    for name in ("ckpt-10.index", "ckpt-10.data-00000-of-00001"):  # a complete save, never listed
        shutil.copy(tmp_path / name, tmp_path / name.replace("ckpt-10", "ckpt-13"))
        shutil.copy(tmp_path / name, tmp_path / name.replace("ckpt-10", "ckpt-3"))
    os.mkdir(tmp_path / "ckpt-13_temp")
    (tmp_path / "ckpt-7.txt").write_text("not a checkpoint file")
    store = CheckpointStore(tmp_path, *fresh(), "hash")
    assert store.remove_unfinished_saves() == ["ckpt-13.data-00000-of-00001", "ckpt-13.index", "ckpt-13_temp",
                                               "ckpt-9_temp"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-10.data-00000-of-00001", "ckpt-10.index",
                                            "ckpt-3.data-00000-of-00001", "ckpt-3.index",
                                            "ckpt-5.data-00000-of-00001", "ckpt-5.index", "ckpt-7.txt"]
    assert store.restore_latest() == 10 and store.remove_unfinished_saves() == []
    assert CheckpointStore(tmp_path / "none", *fresh(), "hash").remove_unfinished_saves() == []


def test_a_resume_with_another_accumulation_restores_the_moments_and_counts_on_from_the_update(tmp_path):
    """`--accumulate` changed on resume (8 GPUs' run going on on 2, or half the batch after
    running out of memory): Keras stores the accumulators among the optimizer's variables by
    position, so a plain restore fails ("incompatible tensor"). The store restores such a
    checkpoint through an optimizer of its form: weights and Adam's moments as saved, the
    update count the checkpoint's, the batch counter that count times the new K, the
    accumulators empty; also inside mixed_float16's loss-scaling wrapper."""
    from keras_transformer.training.schedule import CountingLossScaleOptimizer

    rng = np.random.default_rng(2)

    def trained(accumulate, directory):
        model = build_transformer(CONFIG)
        optimizer = make_optimizer(CONFIG, accumulate)
        optimizer.build(model.trainable_variables)
        for _ in range(3 * accumulate):  # three updates
            optimizer.apply([rng.normal(size=v.shape).astype("float32") for v in model.trainable_variables],
                            model.trainable_variables)
        CheckpointStore(directory, model, optimizer, "hash").save(3)
        return model, optimizer

    for saved_with, resumed_with in ((2, 1), (1, 2), (2, 3)):
        directory = tmp_path / f"{saved_with}-{resumed_with}"
        saved_model, saved = trained(saved_with, directory)
        model = build_transformer(CONFIG)
        optimizer = make_optimizer(CONFIG, resumed_with)
        optimizer.build(model.trainable_variables)
        assert CheckpointStore(directory, model, optimizer, "hash").restore_latest() == 3
        assert int(optimizer._iterations.numpy()) == 3 * resumed_with
        for got, want in zip(model.get_weights(), saved_model.get_weights()):
            np.testing.assert_array_equal(got, want)
        for name in ("_momentums", "_velocities"):
            assert any(np.abs(w.numpy()).max() > 0 for w in getattr(saved, name))
            for got, want in zip(getattr(optimizer, name), getattr(saved, name)):
                np.testing.assert_array_equal(got.numpy(), want.numpy())
        for accumulator in getattr(optimizer, "_accumulated_gradients", []):
            assert not np.abs(accumulator.numpy()).any()

    # mixed_float16: the loss-scaling wrapper around the optimizer, its scale and skip count kept.
    model = build_transformer(CONFIG)
    saved = CountingLossScaleOptimizer(make_optimizer(CONFIG), initial_scale=64.0)
    saved.build(model.trainable_variables)
    for gradient in (1.0, np.inf, 2.0):  # two updates and an overflow: the scale halved, one step skipped
        saved.apply([np.full(v.shape, gradient, "float32") for v in model.trainable_variables], model.trainable_variables)
    CheckpointStore(tmp_path / "mixed", model, saved, "hash").save(3)
    other = build_transformer(CONFIG)
    resumed = CountingLossScaleOptimizer(make_optimizer(CONFIG, 2), initial_scale=64.0)
    resumed.build(other.trainable_variables)
    assert CheckpointStore(tmp_path / "mixed", other, resumed, "hash").restore_latest() == 3
    assert (int(resumed.inner_optimizer._iterations.numpy()), float(resumed.dynamic_scale.numpy()),
            int(resumed.skipped_steps.numpy())) == (6, 32.0, 1)
    for got, want in zip(resumed.inner_optimizer._momentums, saved.inner_optimizer._momentums):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_checkpoints_none_of_which_restores_are_refused_in_one_line_not_trained_over(tmp_path):
    """Checkpoints that all fail to restore (all truncated, or an optimizer of another form:
    `--mixed-precision` added on a GPU wraps it in loss scaling) made resuming return step 0:
    the run trained again from scratch and, keeping its newest checkpoints, deleted them. Now
    one line names them, the newest's reason and what to do; the files stay."""
    from keras_transformer.training.schedule import CountingLossScaleOptimizer

    model, optimizer = fresh()
    store = CheckpointStore(tmp_path / "plain", model, optimizer, "hash")
    store.save(4)
    store.save(8)
    wrapped_model = build_transformer(CONFIG)
    wrapped = CountingLossScaleOptimizer(make_optimizer(CONFIG))
    wrapped.build(wrapped_model.trainable_variables)
    with pytest.raises(CheckpointError, match=r"^none of the 2 checkpoints in .*plain can be restored into this model "
                                              r"and optimizer \(newest: ckpt-8: .*\); they are left as they are\. If a "
                                              r"flag that shapes the optimizer changed .*--mixed-precision") as error:
        CheckpointStore(tmp_path / "plain", wrapped_model, wrapped, "hash").restore_latest()
    assert "\n" not in str(error.value)
    assert sorted(p.name for p in (tmp_path / "plain").glob("*.index")) == ["ckpt-4.index", "ckpt-8.index"]
    for path in store.paths:
        with open(path + ".data-00000-of-00001", "wb") as f:
            f.write(b"truncated")
    with pytest.raises(CheckpointError, match=r"^none of the 2 checkpoints .* \(newest: ckpt-8: "):
        CheckpointStore(tmp_path / "plain", *fresh(), "hash").restore_latest()
