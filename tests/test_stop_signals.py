"""Stop signals: asked once, then interrupt; a stuck main thread or TensorFlow call still ends."""

import signal
import time

import pytest

from keras_transformer.training.stop_signals import StopSignals


def test_stop_signals_ask_once_then_interrupt():
    from keras_transformer.console import Terminated

    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        signal.raise_signal(signal.SIGTERM)
        assert signals.received == "SIGTERM"
        with pytest.raises(KeyboardInterrupt) as stop:
            signal.raise_signal(signal.SIGINT)  # a second Ctrl-C quits at once
    assert not isinstance(stop.value, Terminated)
    assert signal.getsignal(signal.SIGTERM) is before
    with StopSignals():
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt) as stop:
            signal.raise_signal(signal.SIGTERM)
    assert isinstance(stop.value, Terminated)  # a second SIGTERM is named so: train.py says it and exits 143
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stop_signal_exits_after_the_grace_period_when_the_main_thread_is_stuck():
    """Issue #19: a SIGTERM while the input pipeline stalled was caught and never acted on
    (Python runs handlers only between the main thread's bytecodes). The watcher thread
    ends the process (128 + the signal) when the grace period passes, or 2 s after a
    second signal; a run that stops by itself in time is left alone."""
    calls = []
    with StopSignals(grace_seconds=0.3, exit=calls.append) as signals:
        signal.raise_signal(signal.SIGTERM)
        assert signals.received == "SIGTERM"
        time.sleep(1.0)  # the "step" never ends
        assert calls == [128 + signal.SIGTERM]
    with StopSignals(grace_seconds=0.5, exit=calls.append):
        signal.raise_signal(signal.SIGTERM)  # the run then stops by itself, in time
    time.sleep(1.0)
    assert calls == [128 + signal.SIGTERM]


def test_a_stop_signal_ends_a_process_blocked_inside_tensorflow():
    """The real case: the main thread waits inside a TensorFlow op that never returns."""
    import subprocess
    import sys

    code = ("import sys, tensorflow as tf\n"
            "from keras_transformer.training.stop_signals import StopSignals\n"
            "queue = tf.queue.FIFOQueue(1, tf.int32)\n"
            "with StopSignals(grace_seconds=1.5):\n"
            "    print('ready', flush=True)\n"
            "    queue.dequeue()  # blocks forever, in C++\n")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert process.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    started = time.time()
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert 1.4 < time.time() - started < 30
    assert "no training step ended within 1.5 s of SIGTERM: exiting now without a new checkpoint" in stderr
    assert "Traceback" not in stderr
