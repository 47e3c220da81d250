"""keras_transformer.console: what the commands' quiet mode keeps off a user's terminal."""

import os
import pathlib
import sys

import pytest

from helpers import CACHE_HIT, LITERT_DELEGATE, ONEDNN_FALLBACK, closed_pipe

from keras_transformer.console import HARMLESS_CACHE_LINES, HARMLESS_LINES, ONEDNN_FALLBACK_LINES, stderr_without


def test_stderr_without_drops_only_the_named_lines_from_file_descriptor_2(capfd):
    """C++ code writes to file descriptor 2, not through sys.stderr: the lines written there
    inside the block come back in order, less those naming a harmless message."""
    with stderr_without(HARMLESS_CACHE_LINES):
        os.write(2, b"first line\n" + CACHE_HIT.encode() + b"E0000 a real error\n")
        os.write(2, CACHE_HIT.encode())
    assert capfd.readouterr().err == "first line\nE0000 a real error\n"


def test_stderr_without_gives_back_the_lines_and_the_error_when_the_block_raises(capfd):
    with pytest.raises(ValueError, match="the request failed"):
        with stderr_without(HARMLESS_CACHE_LINES):
            os.write(2, CACHE_HIT.encode() + b"E0000 why it failed\n")
            raise ValueError("the request failed")
    assert capfd.readouterr().err == "E0000 why it failed\n"
    os.write(2, b"after\n")  # file descriptor 2 is the terminal's again
    assert capfd.readouterr().err == "after\n"


def test_the_commands_drop_the_cache_hits_onednns_fallback_and_litert_delegate_notices_only(capfd):
    with stderr_without(HARMLESS_LINES):
        os.write(2, (ONEDNN_FALLBACK + "E0000 util.cc:131] oneDNN supports DT_INT32, a line of another text\n"
                     + CACHE_HIT + LITERT_DELEGATE).encode())
    assert capfd.readouterr().err == "E0000 util.cc:131] oneDNN supports DT_INT32, a line of another text\n"


def test_onednns_once_per_process_fallback_notice_is_said_and_dropped_ahead_of_time():
    """With oneDNN on (train.py's default) on a CPU without AVX-512, TensorFlow logs once per
    process, as an error, that oneDNN leaves an int32 or bfloat16 op to its own kernel:
    `train.py --mixed-precision` printed it among its first round's lines. `say_onednn_fallback`,
    which training calls before its first step, meets it while file descriptor 2 is filtered.
    (On a CPU with AVX-512, the reference kind, TensorFlow never logs it: this passes trivially.)"""
    import subprocess
    import sys

    code = ("import tensorflow as tf\n"
            "from keras_transformer import console\n"
            "console.say_onednn_fallback()\n"
            "a = tf.ones([4, 4], tf.bfloat16)\n"
            "print(tf.function(lambda x: tf.matmul(x, x))(a).numpy().sum(), tf.function(lambda x: tf.transpose(x))"
            "(tf.ones([2, 3], tf.int32)).shape)\n")
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "64 (3, 2)\n"
    assert not [line for line in result.stderr.splitlines() if ONEDNN_FALLBACK_LINES[0] in line], result.stderr


def test_sigterm_raises_terminated_inside_the_block_only_and_names_it_in_one_line(capsys):
    """`console.sigterm_raises`: a SIGTERM inside the block raises `Terminated` (a
    KeyboardInterrupt, so Ctrl-C's clean-up handles it); the previous handler is back after the
    block, an ignored SIGTERM stays ignored, and another thread's block changes nothing."""
    import signal
    import threading
    import time

    from helpers import sigterm_self

    from keras_transformer.console import Terminated, interrupted, sigterm_raises

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        with sigterm_raises():
            sigterm_self()
    assert signal.getsignal(signal.SIGTERM) is before and issubclass(Terminated, KeyboardInterrupt)

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # e.g. under a parent that ignores it
    try:
        with sigterm_raises():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # ignored: nothing raised
    finally:
        signal.signal(signal.SIGTERM, before)

    seen = []

    def elsewhere():
        with sigterm_raises():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert seen == [before]

    assert interrupted("export.x", Terminated("SIGTERM"), "nothing was left in OUT") == 143
    assert interrupted("export.x", KeyboardInterrupt(), "nothing was left in OUT") == 130
    assert capsys.readouterr().err == ("export.x: interrupted by SIGTERM; nothing was left in OUT\n"
                                       "export.x: interrupted by Ctrl-C; nothing was left in OUT\n")


def test_input_lines_are_the_bytes_of_each_line_as_an_editor_means_them():
    """The stdin of `export.translate` and `export.tflite --translate`: a file saved on
    Windows (a UTF-8 byte order mark first, CR LF line ends) gives the same lines as one
    saved on Linux; a mark anywhere but at the start stays (it is text there); invalid UTF-8
    stays as it is (the tokenizer takes any bytes); a last line without its line end
    counts; lines come one at a time, as they are read."""
    import io

    from keras_transformer.console import input_lines

    linux = b"a house\nthe \xff dog\n\n\xef\xbb\xbfinside\nlast"
    windows = b"\xef\xbb\xbf" + linux.replace(b"\n", b"\r\n")
    expected = [b"a house", b"the \xff dog", b"", b"\xef\xbb\xbfinside", b"last"]
    assert list(input_lines(io.BytesIO(linux))) == list(input_lines(io.BytesIO(windows))) == expected
    assert list(input_lines(io.BytesIO(b""))) == [] and list(input_lines(io.BytesIO(b"\xef\xbb\xbf"))) == [b""]

    def typed():  # a terminal: the second line does not exist until the first is answered
        yield b"first\n"
        raise AssertionError("read ahead")

    assert next(input_lines(typed())) == b"first"


def test_a_command_whose_reader_stops_exits_1_without_a_word(monkeypatch, capsys):
    """`stops_quietly_for_a_closed_pipe`: a command printing into a pipe whose reader has
    gone (`... | head -3`) returns 1 and says nothing, whether the write fails in the
    command or in the last flush (after a `sys.exit`, as the stock saved_model_cli ends);
    with a reader, the command's output and exit code; any other OSError is raised."""
    import errno

    from keras_transformer.console import stops_quietly_for_a_closed_pipe

    @stops_quietly_for_a_closed_pipe
    def command(argv):
        for line in range(argv[0]):
            print(f"line {line}")
        if argv[1] == "exit":
            sys.exit(0)
        if argv[1] == "full disk":
            raise OSError(errno.ENOSPC, "No space left on device")
        return 0

    for argv, buffering in (([10_000, ""], 1), ([1, "exit"], -1)):  # a line at a time / kept until the flush
        with closed_pipe(buffering) as closed:
            monkeypatch.setattr(sys, "stdout", closed)
            assert command(argv) == 1, argv
        assert capsys.readouterr().err == ""
    read, write = os.pipe()
    with os.fdopen(write, "w") as piped, os.fdopen(read) as reader:
        monkeypatch.setattr(sys, "stdout", piped)
        assert command([3, ""]) == 0
        with pytest.raises(SystemExit) as exit_:
            command([0, "exit"])
        assert exit_.value.code == 0
        with pytest.raises(OSError, match="No space left on device"):
            command([0, "full disk"])
        piped.close()
        assert reader.read() == "line 0\nline 1\nline 2\n"


CONSOLE = pathlib.Path(__file__).resolve().parents[1] / "keras_transformer" / "console.py"


@pytest.mark.parametrize("fail", [False, True])
def test_tensorflows_first_import_is_quiet_whenever_it_comes_and_a_failed_one_says_why(tmp_path, fail):
    """`quiet_tensorflow` imports nothing itself: the import that first brings TensorFlow in,
    whenever it comes, runs with file descriptor 2 captured (the C++ start-up lines and the
    device probe's are dropped), and the module is as if found without us (its own loader);
    a failing import gives back what it printed, with its error. Shown with a stand-in
    `tensorflow` package that prints from "C++" as it loads and as it lists devices."""
    import subprocess

    fake = tmp_path / "tensorflow"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import os\nos.write(2, b'I0000 start-up line\\n')\n"
        "if os.environ.get('FAIL'):\n    raise ImportError('no kernels for this CPU')\n"
        "class config:\n    @staticmethod\n    def list_physical_devices():\n"
        "        os.write(2, b'E0000 cuInit failed\\n')\n        return []\n")
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('console', {str(CONSOLE)!r})\n"
            "console = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(console)\n"
            "console.quiet_tensorflow()\nconsole.quiet_tensorflow()\n"
            "print('tensorflow' in sys.modules, flush=True)\n"
            "try:\n    import tensorflow\nexcept ImportError as error:\n    print('failed:', error)\n"
            "else:\n    print(type(tensorflow.__loader__).__name__, tensorflow.__spec__.loader is tensorflow.__loader__,\n"
            "          [type(f).__name__ for f in sys.meta_path].count('_QuietFirstImport'))\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    env.pop("FAIL", None)
    if fail:
        env["FAIL"] = "1"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    if fail:
        assert result.stdout == "False\nfailed: no kernels for this CPU\n"
        assert result.stderr == "I0000 start-up line\n"
    else:
        assert result.returncode == 0, result.stderr
        assert result.stdout == "False\nSourceFileLoader True 0\n"
        assert result.stderr == ""


def test_the_packages_lazy_names_are_its_eager_names():
    """The project's commands get `keras_transformer`'s names on first use (`_MODULES` says
    where each lives); a library user's import binds them at once: the same objects."""
    import importlib

    import keras_transformer

    assert sorted(keras_transformer._MODULES) == sorted(keras_transformer.__all__)
    for name, module in keras_transformer._MODULES.items():
        lazy = getattr(importlib.import_module(f"keras_transformer.{module}"), name)
        assert lazy is getattr(keras_transformer, name), name
