"""SIGTERM and Ctrl-C during training: a request to stop after the current step
with a checkpoint, and an exit when the main thread is stuck inside TensorFlow."""

from __future__ import annotations

import math
import os
import select
import signal
import sys
import threading
import time

from keras_transformer.console import Terminated


class Interrupted(Exception):
    """Raised inside `fit` after a step when a stop signal arrived."""


# Seconds a stop request may wait for the current step to end before the process exits
# without a new checkpoint (a stalled input pipeline, a hung collective): resuming then
# starts from the newest complete checkpoint.
STOP_GRACE_SECONDS = 60.0
# ...and a second stop signal, for the main thread to raise KeyboardInterrupt itself.
SECOND_SIGNAL_SECONDS = 2.0


class StopSignals:
    """Turns SIGTERM and the first Ctrl-C into a request to stop after the
    current step, with a checkpoint.

    Python runs a signal handler only between bytecodes of the main thread, and
    a main thread blocked inside TensorFlow (an input pipeline that never yields
    a batch) may never get there. A watcher thread therefore reads the signals
    from `signal.set_wakeup_fd`, which the interpreter writes at once, and exits
    the process (status 128 + the signal) when the main thread has not left the
    `with` block `grace_seconds` after the first SIGTERM/Ctrl-C, or 2 s after a
    second one (which otherwise raises KeyboardInterrupt in the main thread).

    Args:
        grace_seconds: how long the first signal waits for the step to end.
        exit: what ends the process (`os._exit`; a test passes its own).
    """

    def __init__(self, grace_seconds: float = STOP_GRACE_SECONDS, exit=os._exit):
        self.received = None
        self.grace_seconds = grace_seconds
        self._exit = exit
        self._previous = {}
        self._pipe = None
        self._previous_wakeup_fd = -1
        self._watcher = None

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        if self._previous:
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)
            self._pipe = (read_fd, write_fd)
            self._previous_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
            self._watcher = threading.Thread(target=self._watch, name="stop-signals", daemon=True)
            self._watcher.start()
        return self

    def _handle(self, signum, frame):
        if self.received is not None:  # a second SIGTERM/Ctrl-C quits at once
            raise Terminated("SIGTERM") if signum == signal.SIGTERM else KeyboardInterrupt
        self.received = signal.Signals(signum).name
        print(f"\n{self.received} received: stopping after the current step and writing a checkpoint "
              f"(Ctrl-C again to quit at once)", file=sys.stderr, flush=True)

    def _watch(self):
        read_fd = self._pipe[0]
        signals, deadline = [], None
        while True:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([read_fd], [], [], timeout)
            if not ready:  # the main thread did not get there in time: it is stuck
                reason = (f"no training step ended within {self.grace_seconds:g} s of {signals[0].name}"
                          if len(signals) == 1 else f"a second stop signal ({signals[1].name})")
                self._quit(signals[-1], reason)
                return
            data = os.read(read_fd, 64)
            if not data or 0 in data:  # closed, or __exit__'s stop byte: the run ended by itself
                return
            for signum in data:
                if signum in (signal.SIGTERM, signal.SIGINT):
                    signals.append(signal.Signals(signum))
                    # The main thread normally acts first (a checkpoint; or KeyboardInterrupt
                    # on the second signal), leaving the `with` block, which stops this watcher.
                    wait = self.grace_seconds if len(signals) == 1 else SECOND_SIGNAL_SECONDS
                    deadline = min(deadline or math.inf, time.monotonic() + wait)

    def _quit(self, signum, reason):
        print(f"\n{reason}: exiting now without a new checkpoint. Run the same command again to resume "
              f"from the newest complete checkpoint.", file=sys.stderr, flush=True)
        self._exit(128 + int(signum))

    def __exit__(self, *exc):
        if self._pipe:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            os.write(self._pipe[1], b"\0")
            self._watcher.join(timeout=5)
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False
