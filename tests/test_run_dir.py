"""A run directory's files: the history written atomically."""

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
