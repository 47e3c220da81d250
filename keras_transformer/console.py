"""Console output a user can read: the command-line tools' quiet mode.

TensorFlow prints start-up lines from C++ before its logging is set up
("All log messages before absl::InitializeLog() ...", oneDNN, CUDA stubs,
`cuInit`), which `TF_CPP_MIN_LOG_LEVEL` does not silence, and Keras/absl
print warnings that mean nothing to a user of our commands. The commands
are quiet unless `--verbose` (`quiet_requested`): `python train.py` and
`python -m` of a module of `keras_transformer`, `export` or `benchmarks`, as
the interpreter's command line says (`sys.orig_argv`), so no entry point has
to set anything before its imports; `KERAS_TRANSFORMER_QUIET=1` / `=0` asks
for it, or against it, in any program. The package's `__init__` then has
TensorFlow's first import, whenever it comes, made with file descriptor 2 sent
to a temporary file, which is replayed if the import fails (`quiet_tensorflow`).
Library users who do not ask see everything.

This module imports nothing heavy at module level: `keras_transformer/__init__`
runs it before Keras and TensorFlow are imported.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import importlib
import importlib.abc
import importlib.util
import logging
import math
import os
import sys
import tempfile
import warnings

QUIET_ENV = "KERAS_TRANSFORMER_QUIET"

# Warnings that a normal run of our commands triggers and that ask nothing of
# the user (what they mean is handled by the code that triggers them).
_IGNORED_WARNINGS = (
    # Keras: fit(shuffle=True) is meaningless for a tf.data dataset (ours shuffles itself).
    r".*`shuffle=True` was passed, but will be ignored.*",
    r".*shuffle=True.*ignored.*",
    # Keras: evaluate/validation on a finite dataset reaching its end is how it ends.
    r".*[Yy]our input ran out of data.*",
    # NumPy 2 + TF tensors' __array__ (harmless copy semantics notice).
    r".*__array__ implementation doesn't accept a copy keyword.*",
)
_IGNORED_ABSL = (
    "Sharding callback duration",
    "contains input name(s)",  # tf.saved_model.save: "Function `_serve` contains input name(s) ..."
    "Found untraced functions",
    "Compiled the loaded model, but the compiled metrics have yet to be built",
)


def names_on_first_use(module: str, sources: dict):
    """A module-level `__getattr__` for `module` (its `__name__`) that imports each name of
    `sources` (`{name: the module that defines it}`) on first use and keeps it in `module`:
    how a command's modules and packages keep TensorFlow out of `--help` and flag errors."""
    def __getattr__(name):
        if name not in sources:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(sources[name]), name)
        setattr(sys.modules[module], name, value)
        return value

    return __getattr__


# The project's commands: scripts run as files, and packages whose modules run with `python -m`.
COMMAND_SCRIPTS = ("train.py",)
COMMAND_PACKAGES = ("keras_transformer", "export", "benchmarks", "tools")
# Interpreter options that take a value (`python -X dev -m ...`).
_OPTIONS_WITH_VALUE = ("-X", "-W", "-Q")


def main_program(argv=None) -> tuple[str, str] | None:
    """What the interpreter was asked to run, from its command line (`sys.orig_argv`):
    `("module", NAME)` for `python -m NAME`, `("script", PATH)` for `python PATH`,
    None for `-c`, stdin or an embedded interpreter."""
    args = list(sys.orig_argv[1:] if argv is None else argv)
    while args:
        arg = args.pop(0)
        if arg == "-m":
            return ("module", args[0]) if args else None
        if arg.startswith("-m"):  # python -mNAME
            return "module", arg[2:]
        if arg == "-" or arg.startswith("-c"):  # stdin, or python -c CODE
            return None
        if arg in _OPTIONS_WITH_VALUE:
            args = args[1:]
        elif not arg.startswith("-"):
            return "script", arg
    return None


def running_command(argv=None) -> bool:
    """Whether the main program is one of the project's commands (`COMMAND_SCRIPTS`, or a
    module of `COMMAND_PACKAGES` run with `python -m`)."""
    program = main_program(argv)
    if program is None:
        return False
    kind, name = program
    if kind == "module":
        return name.partition(".")[0] in COMMAND_PACKAGES
    return os.path.basename(name) in COMMAND_SCRIPTS


# Commands that turn TensorFlow's oneDNN kernels on where the environment does not choose
# (`TF_ENABLE_ONEDNN_OPTS` unset or empty): `python train.py` and `python -m export.translate`.
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
ONEDNN_COMMANDS = ("train.py", "export.translate")


def onednn_requested(argv=None, environ=None) -> bool:
    """Whether to turn TensorFlow's oneDNN kernels on before it loads: the main program is
    one of `ONEDNN_COMMANDS` and `environ` (default `os.environ`) leaves `TF_ENABLE_ONEDNN_OPTS`
    unset or empty (`0` or `1` there is the user's choice, kept).

    TensorFlow turns them on by itself only on CPUs with AVX-512 VNNI or BF16, or AMX. On a
    2-vCPU AMD EPYC with AVX2 they trained the `multi30k` preset 1.4-1.8x and `base` 1.1-1.2x
    as fast, with the same losses up to float rounding, and the export's XLA search
    (`translate_xla`, `export.translate --xla`) translated batches of 32 1.25-1.35x as fast
    and single sentences about as fast (docs/training.md "Speed options"; docs/lab-notebook, "Training with
    oneDNN on an AVX2 CPU"). `export.translate` without `--xla` (`serving_default`) took
    the same time either way (docs/lab-notebook, "Training's BLEU in the plain graph").
    """
    environ = os.environ if environ is None else environ
    program = main_program(argv)
    if environ.get(ONEDNN_ENV) or program is None:
        return False
    kind, name = program
    return (name if kind == "module" else os.path.basename(name)) in ONEDNN_COMMANDS


def request_onednn() -> None:
    """`TF_ENABLE_ONEDNN_OPTS=1` for this process and its children (`onednn_requested`);
    the package's `__init__` calls it before TensorFlow loads."""
    os.environ[ONEDNN_ENV] = "1"


def quiet_requested() -> bool:
    """`KERAS_TRANSFORMER_QUIET` when set (`1`: quiet); otherwise quiet for the project's
    commands unless `--verbose` is among their arguments."""
    if QUIET_ENV in os.environ:
        return os.environ[QUIET_ENV] == "1"
    return running_command() and "--verbose" not in sys.argv[1:]


@contextlib.contextmanager
def _fd2_sent_to(file):
    """File descriptor 2 (C++ logging included) sent to `file` for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _lines(file):
    file.seek(0)
    return file.read().decode("utf-8", "replace").splitlines(keepends=True)


@contextlib.contextmanager
def _stderr_captured():
    """Sends file descriptor 2 (C++ logging included) to a temporary file;
    replays it if the block raises."""
    with tempfile.TemporaryFile(mode="w+b") as captured:
        try:
            with _fd2_sent_to(captured):
                yield
        except BaseException:
            sys.stderr.write("".join(_lines(captured)))
            raise


# Lines TensorFlow's C++ side prints that ask nothing of the user, for `stderr_without`.
# Each hit of the persistent XLA cache (`TF_XLA_FLAGS=--tf_xla_persistent_cache_directory`)
# logs one: TensorFlow reads the binary entry it wrote as text first
# (`ReadTextOrBinaryProto`), logs that parse's failure as an error, then reads it as binary.
HARMLESS_CACHE_LINES = ("Error parsing text-format tensorflow.XlaSerializedCacheEntry",)
# With oneDNN on (`onednn_requested`), the first int32 op that its graph rewrite gave to
# oneDNN logs, as an error, that it runs TensorFlow's own kernel instead: `oneDNN supports
# DT_INT32 only on platforms with AVX-512. Falling back to the default Eigen-based
# implementation if present.` (`serving_default`'s and `translate_options`' plain search on a
# 2-vCPU AVX2 EPYC, TensorFlow 2.21; a Multi30k model's `serving_default` logged it on the
# 2-vCPU AVX-512 Zen 4 as well, 2026-12-07, and `train_and_evaluate` on a 2-vCPU Intel Xeon with AMX).
ONEDNN_FALLBACK_LINES = ("only on platforms with AVX-512. Falling back to the default Eigen-based implementation",)
# LiteRT (ai-edge-litert) logs, from C++ and whatever TF_CPP_MIN_LOG_LEVEL says, when its
# interpreter first runs a model: `INFO: Created TensorFlow Lite XNNPACK delegate for CPU.`
LITERT_LINES = ("INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",)
HARMLESS_LINES = HARMLESS_CACHE_LINES + ONEDNN_FALLBACK_LINES + LITERT_LINES


@contextlib.contextmanager
def stderr_without(fragments):
    """Runs the block with file descriptor 2 (C++ logging included) sent to a temporary
    file, then writes back every line that contains none of `fragments`, also when the
    block raises."""
    with tempfile.TemporaryFile(mode="w+b") as captured:
        try:
            with _fd2_sent_to(captured):
                yield
        finally:
            sys.stderr.write("".join(line for line in _lines(captured)
                                     if not any(fragment in line for fragment in fragments)))
            sys.stderr.flush()


def harmless_lines_dropped():
    """`stderr_without(HARMLESS_LINES)` for a quiet command's block, a no-op otherwise
    (`--verbose`, or a library user who did not ask)."""
    return stderr_without(HARMLESS_LINES) if quiet_requested() else contextlib.nullcontext()


class _AbslFilter(logging.Filter):
    def filter(self, record):
        message = record.getMessage()
        return not any(text in message for text in _IGNORED_ABSL)


def quiet_tensorflow() -> None:
    """TensorFlow's first import made without its start-up lines (file descriptor 2 captured,
    replayed if the import fails), and the warnings of `_IGNORED_WARNINGS` / `_IGNORED_ABSL`
    filtered. TensorFlow is not imported here: `_QuietFirstImport` wraps whichever import
    brings it in first, so that a command that ends before it needs TensorFlow (`train.py
    --help`, a flag error) answers without its start-up (~6.6 CPU s on a 2-vCPU EPYC).
    Idempotent; the capture is skipped once TensorFlow was imported by someone else. The
    process's children (a command's LiteRT checks, a benchmark's workers) inherit the request."""
    os.environ.setdefault(QUIET_ENV, "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for pattern in _IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    if "tensorflow" in sys.modules:
        _quiet_loggers()
    elif not any(isinstance(finder, _QuietFirstImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietFirstImport())


def _quiet_loggers() -> None:
    # tf.saved_model.save's "Assets written to ..." and similar INFO lines.
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    for name in ("absl", "tensorflow", "keras"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _AbslFilter) for f in logger.filters):
            logger.addFilter(_AbslFilter())
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # pragma: no cover - absl comes with TensorFlow
        pass


class _QuietFirstImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A `sys.meta_path` finder for `tensorflow` alone, used once: it finds TensorFlow through
    the other finders and runs that loader with file descriptor 2 captured, then lists the
    devices inside the same capture (the CUDA probe's `cuInit` line comes there)."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self._loader  # as if found without us
        with _stderr_captured():
            self._loader.exec_module(module)
            module.config.list_physical_devices()
        _quiet_loggers()


def say_onednn_fallback() -> None:
    """Runs one int32 op through a `tf.function` with file descriptor 2 filtered
    (`ONEDNN_FALLBACK_LINES`). With oneDNN on, on a CPU without AVX-512, TensorFlow logs once
    per process, for whichever type comes first, that its oneDNN rewrite leaves an int32 or
    bfloat16 op to its own kernel: otherwise in the middle of a `train.py --mixed-precision`
    run's output, where no line filter can run without holding back the live progress line.
    (An int32 op first, then a bfloat16 matmul: one line, on a 2-vCPU AVX2 EPYC, TensorFlow
    2.21.) Call it once TensorFlow's context is set up (thread counts, strategy): it runs an op."""
    import tensorflow as tf

    with stderr_without(ONEDNN_FALLBACK_LINES):
        tf.function(lambda x: tf.transpose(x) + 1)(tf.ones([2, 2], tf.int32))


def onednn_state() -> str:
    """`"on"` or `"off"`: whether this process's TensorFlow runs its oneDNN kernels, which
    it decides when it loads (`TF_ENABLE_ONEDNN_OPTS`, else on only for CPUs with AVX-512
    VNNI or BF16, or AMX); `"unknown"` where this TensorFlow does not say. Imports
    TensorFlow."""
    try:
        from tensorflow.python.util import _pywrap_util_port  # TensorFlow's own test utilities ask it so
    except ImportError:  # pragma: no cover - another TensorFlow layout
        return "unknown"
    is_enabled = getattr(_pywrap_util_port, "IsMklEnabled", None)
    return "unknown" if is_enabled is None else ("on" if is_enabled() else "off")


def setup_logging(verbose: bool = False) -> None:
    """Our own progress messages (`INFO`), timestamped, on stderr."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")


class PositiveInt(argparse.Action):
    """`type=int` flag whose value must be at least 1, refused as the parser's one-line error
    `FLAG must be a positive integer, got N` (export.translate's `--batch-size 0` had sent all
    of stdin as one request)."""

    def __call__(self, parser, namespace, value, option_string=None):
        if value < 1:
            parser.error(f"{option_string} must be a positive integer, got {value}")
        setattr(namespace, self.dest, value)


class FiniteFloat(argparse.Action):
    """`type=float` flag whose value must be a finite number (Python's `float` reads `nan` and
    `inf`), refused as the parser's one-line error `FLAG must be a finite number, got X`
    (export.translate's `--alpha nan` had printed an empty line for every sentence)."""

    def __call__(self, parser, namespace, value, option_string=None):
        if not math.isfinite(value):
            parser.error(f"{option_string} must be a finite number, got {value}")
        setattr(namespace, self.dest, value)


class OneLineArgumentParser(argparse.ArgumentParser):
    """`argparse` whose errors are one line, `PROG: error: MESSAGE` (exit 2),
    without the usage block; `--help` still shows everything."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def input_lines(stream):
    """The lines of a binary stream (`sys.stdin.buffer`) as bytes, as a file saved by any
    editor means them: without the line ends (LF, or CR LF from Windows) and without a UTF-8
    byte order mark before the first line. Bytes, never decoded: the export's tokenizer
    takes any bytes, so invalid UTF-8 is translated, not a UnicodeDecodeError. Read lazily,
    so a command can answer each request before the next line is typed."""
    from keras_transformer.constants import UTF8_BOM

    for number, line in enumerate(stream):
        if number == 0 and line.startswith(UTF8_BOM):
            line = line[len(UTF8_BOM):]
        yield line.rstrip(b"\r\n")


def stdout_failed(prog: str, error: OSError, written: str) -> int:
    """The exit code of a command whose standard output failed: quiet for a reader that
    stopped (`... | head -2` was a BrokenPipeError traceback), one line `PROG: error:
    cannot write the translations: REASON; WRITTEN` for a full disk. Standard output then
    points at /dev/null, so the interpreter's own flush at exit stays quiet (Python's
    documented recipe). Any other OSError is raised again."""
    if not isinstance(error, BrokenPipeError) and error.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT,
                                                                      errno.EIO):
        raise error
    _stdout_to_devnull()
    if isinstance(error, BrokenPipeError):
        return 1
    print(f"{prog}: error: cannot write the translations: {error.strerror}; {written}", file=sys.stderr)
    return 2


def _stdout_to_devnull():
    """Points standard output at /dev/null, so that the interpreter's own flush at exit, of
    what a failed write left in the buffer, stays quiet (Python's documented recipe for a
    closed pipe)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def stops_quietly_for_a_closed_pipe(main):
    """Decorates the `main(argv) -> int` of a command that prints to standard output: when
    its reader stops (`python -m export.op_audit EXPORT | head -3`), the command exits 1
    without a word, as `stdout_failed` makes the translate commands do. It was a
    BrokenPipeError traceback, and Python's `Exception ignored ... BrokenPipeError` once
    more at exit. Standard output is flushed before `main` returns, so that a pipe closed
    after the last write fails here, not in the interpreter's flush at exit."""
    @functools.wraps(main)
    def command(argv=None) -> int:
        try:
            try:
                code = main(argv)
            finally:  # (also when `main` raises SystemExit: a failed flush then takes its place)
                sys.stdout.flush()
        except BrokenPipeError:
            _stdout_to_devnull()
            return 1
        return code

    return command


class Terminated(KeyboardInterrupt):
    """SIGTERM inside a `sigterm_raises` block, raised in the main thread as Ctrl-C raises
    `KeyboardInterrupt` (a subclass, so every handler of Ctrl-C handles it too)."""


def _raise_terminated(signum, frame):
    raise Terminated("SIGTERM")


@contextlib.contextmanager
def sigterm_raises():
    """Within the block, SIGTERM raises `Terminated` in the main thread instead of ending the
    process at once, so that the block's clean-up runs: a SIGTERM while `export.saved_model`
    wrote had left its `.tmp-VERSION-PID` directory (8 MB for `tiny`; a new one at every
    such stop, since the name holds the pid). Python runs the handler between bytecodes, so a
    long TensorFlow call ends first. Outside the main thread, or where SIGTERM is ignored
    (`nohup`-like parents), it changes nothing."""
    import signal

    previous = signal.getsignal(signal.SIGTERM)
    installed = previous is not signal.SIG_IGN
    if installed:
        try:
            signal.signal(signal.SIGTERM, _raise_terminated)
        except ValueError:  # not the main thread
            installed = False
    try:
        yield
    finally:
        if installed:  # (None: a handler set outside Python, which SIG_DFL stands for)
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def interrupted(prog: str, error: KeyboardInterrupt, what: str) -> int:
    """The exit code of a command stopped by Ctrl-C (130) or by `Terminated` (143, 128 +
    SIGTERM), after one line `PROG: interrupted by SIGNAL; WHAT` on stderr."""
    terminated = isinstance(error, Terminated)
    print(f"{prog}: interrupted by {'SIGTERM' if terminated else 'Ctrl-C'}; {what}", file=sys.stderr)
    return 143 if terminated else 130
