"""train.py end to end: distribution, kill -9 resume, guards on the model directory."""

import concurrent.futures
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import fixture_seed, import_log, in_background, write_corpus

ROOT = pathlib.Path(__file__).resolve().parents[1]

def train_command(data, model_dir, *extra):
    return [sys.executable, str(ROOT / "train.py"), "--data", str(data), "--model-dir", str(model_dir),
            "--vocab-size", "60", "--batch-tokens", "256", "--bleu-every-sentences", "0",
            "--no-export", "--seed", str(fixture_seed()), *extra]


def run_train(*args, timeout=600, env=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


MIRRORED = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 8)
    import keras
    from keras_transformer import (LabelSmoothedCrossEntropy, TransformerConfig, build_transformer,
                                   make_optimizer)

    config = TransformerConfig(vocab_size=40, num_layers=1, d_model=16, d_ff=32, num_heads=2,
                               dropout=0.0, warmup_steps=10)
    rng = np.random.default_rng(0)
    # 16 sentences without padding: every replica holds 2 sentences of equal
    # token count, so the mean of per-replica means is the global mean.
    source = rng.integers(4, 40, size=(16, 6)).astype("int32")
    target_in = np.concatenate([np.full((16, 1), 2, "int32"), source[:, :5]], axis=1)
    target_out = source.copy()
    dataset = tf.data.Dataset.from_tensors(((source, target_in), target_out)).repeat(4)

    def train(strategy, optimizer=lambda: make_optimizer(config)):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = build_transformer(config)
            model.compile(optimizer=optimizer(), loss=LabelSmoothedCrossEntropy())
        losses = []
        for _ in range(4):
            losses.append(float(model.train_on_batch((source, target_in), target_out)))
        return losses, model

    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    mirrored = tf.distribute.MirroredStrategy(cpus)
    many, model_many = train(mirrored)
    one, model_one = train(tf.distribute.get_strategy())
    # Plain SGD moves weights in proportion to the gradient: a sum over replicas instead of
    # a mean would step 8x as far (Adam, scale-invariant, would not show it).
    sgd = lambda: keras.optimizers.SGD(learning_rate=0.5)
    many_sgd, model_many_sgd = train(mirrored, sgd)
    one_sgd, model_one_sgd = train(tf.distribute.get_strategy(), sgd)
    keras.utils.set_random_seed(0)
    initial = build_transformer(config)  # the weights both runs started from
    moved = [float(np.abs(a - b).max()) for a, b in zip(model_one_sgd.get_weights(), initial.get_weights())]
    gaps = [float(np.abs(a - b).max()) for a, b in zip(model_many_sgd.get_weights(), model_one_sgd.get_weights())]

    # Gradient accumulation (train.py --accumulate 2) on the 8 replicas: each update reads the
    # first 8 sentences, then the last 8 (one a replica each time), and must be one device's
    # update on all 16 (each half holds the same number of real tokens). FusedAdam with
    # epsilon 1e-3, so that summation-order noise in the rows of absent tokens stays noise.
    from keras_transformer import TransformerSchedule
    from keras_transformer.training.schedule import FusedAdam
    adam = lambda steps: lambda: FusedAdam(TransformerSchedule(16, 10), epsilon=1e-3,
                                           gradient_accumulation_steps=steps)
    keras.utils.set_random_seed(0)
    with mirrored.scope():
        accumulated = build_transformer(config)
        accumulated.compile(optimizer=adam(2)(), loss=LabelSmoothedCrossEntropy())
    for _ in range(4):
        for half in (slice(0, 8), slice(8, 16)):
            accumulated.train_on_batch((source[half], target_in[half]), target_out[half])
    _, whole = train(tf.distribute.get_strategy(), adam(None))
    print(json.dumps({"replicas": mirrored.num_replicas_in_sync, "many": many, "one": one,
                      "many_sgd": many_sgd, "one_sgd": one_sgd, "sgd_moved": max(moved),
                      "sgd_weight_gap": max(gaps),
                      "accumulated_updates": int(accumulated.optimizer.iterations.numpy()),
                      "accumulated_moved": max(float(np.abs(a - b).max())
                                               for a, b in zip(whole.get_weights(), initial.get_weights())),
                      "accumulated_gap": max(float(np.abs(a - b).max())
                                             for a, b in zip(accumulated.get_weights(), whole.get_weights()))}))
""")


CLI_MISUSE = [
    (["--config", "huge"], "argument --config: invalid choice: 'huge'"),
    (["--steps", "0"], "--steps must be a positive integer, got 0"),
    (["--data", "nosuch"], "--data=nosuch: no such directory and not a TFDS dataset name"),
    # Issue #19: a batch budget below one longest pair was a traceback from the batching code.
    (["--batch-tokens", "32"], "--batch-tokens=32 cannot hold one pair of max_length=64 tokens"),
]


def run_cli_misuse(model_dir, flags):
    """train.py with bad flags, without TF_CPP_MIN_LOG_LEVEL (it must be quiet on its own):
    `(CompletedProcess, seconds it took)`."""
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    started = time.time()
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), "--model-dir", str(model_dir), *flags],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return result, time.time() - started


@pytest.fixture(scope="module")
def short_commands(tmp_path_factory, request):
    """train.py --help and the misuse commands (each mostly TensorFlow's start-up on one
    core), run two at a time, all finished before the fixture returns (so before the
    signal test runs): `{key: Future}` for the tests selected in this session, a
    misuse command's key its flags. Each test checks its own result."""
    starts = {"test_help_explains_every_flag": lambda: run_train(sys.executable, str(ROOT / "train.py"), "--help")}
    for flags, _ in CLI_MISUSE:
        starts[tuple(flags)] = lambda flags=flags: run_cli_misuse(tmp_path_factory.mktemp("misuse") / "m", flags)
    selected = {tuple(item.callspec.params["flags"]) if item.originalname == "test_cli_misuse_is_one_line"
                else item.originalname for item in request.session.items if getattr(item, "module", None) is request.module}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:  # one per core
        futures = {key: pool.submit(start) for key, start in starts.items() if key in selected}
    return futures  # all done


@pytest.fixture(scope="module")
def mirrored_figures():
    """The figures of `MIRRORED`, run once in a process of its own (8 logical CPU devices)."""
    result = run_train(sys.executable, "-c", MIRRORED)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_mirrored_strategy_on_8_cpu_devices_matches_single_device(mirrored_figures):
    figures = mirrored_figures
    assert figures["replicas"] == 8
    assert figures["many"][0] > figures["many"][-1]  # it trains
    # Step 1's loss checks the forward pass; steps 2-4 check that the
    # replicas' gradients were combined into the single-device update (a sum
    # instead of a mean, or a missing all-reduce, moves them by far more).
    for many, one in zip(figures["many"], figures["one"]):
        assert many == pytest.approx(one, rel=1e-5)
    # Weights are not compared element-wise: rows of tokens absent from the
    # batch get gradients of ~1e-12 from summation-order noise, which Adam
    # (epsilon 1e-9) turns into full-size steps on one device but not the other.
    # Adam divides by the gradient's own scale, so a sum instead of a mean would pass the
    # check above (issue #19). With SGD the step is the gradient times 0.5: the replicas'
    # losses and weights after 4 steps equal one device's, while the weights moved by far
    # more than the tolerance (a sum would have moved them 8x as far).
    for many, one in zip(figures["many_sgd"], figures["one_sgd"]):
        assert many == pytest.approx(one, rel=1e-5)
    assert figures["sgd_moved"] > 1e-2
    assert figures["sgd_weight_gap"] < 1e-5


@pytest.mark.slow
def test_accumulated_updates_on_8_cpu_devices_are_one_devices_updates_on_both_batches(mirrored_figures):
    """`--accumulate 2` under MirroredStrategy (Keras's own accumulation fails there at the
    first step: `merge_call` in a cond; `FusedAdam` moves the cond to the cross-replica
    context): four updates of two half batches each give one device's weights after four
    updates on the whole batches, where the weights moved by far more than the tolerance."""
    assert mirrored_figures["accumulated_updates"] == 4
    assert mirrored_figures["accumulated_moved"] > 1e-2
    assert mirrored_figures["accumulated_gap"] < 1e-5


def read_history(model_dir):
    import csv

    return list(csv.DictReader((model_dir / "history.csv").open()))


def start_until_first_checkpoint(command, model_dir, env, stderr):
    """Starts `train.py` and returns the running process once its first checkpoint is complete."""
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    state = model_dir / "checkpoints" / "checkpoint"
    deadline = time.time() + 300
    while not state.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, "training ended before it could be stopped:\n" + process.stdout.read()
    return process


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
    """One `train.py` run stopped twice, as a user's run can be, then finished: SIGTERM after
    its first checkpoint (it checkpoints and exits 0); the same command again, killed with
    SIGKILL once it has written a checkpoint of its own; the same command once more, to 15
    steps past that checkpoint (a last round cut short). Each start pays TensorFlow's start-up,
    a trace and (the last) the valid BLEU, so the signal, kill and refusal tests share these
    three starts. A dict of the processes' outputs and the run's paths."""
    root = tmp_path_factory.mktemp("interrupted_run")
    data = write_corpus(root / "data")
    model_dir = root / "run"
    command = train_command(data, model_dir, "--steps", "400", "--checkpoint-every", "10")
    quiet_env = dict(os.environ, PYTHONUNBUFFERED="1")
    quiet_env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the command must be quiet on its own
    process = start_until_first_checkpoint(command, model_dir, quiet_env, stderr=subprocess.PIPE)
    time.sleep(1.0)  # somewhere inside the second round
    process.send_signal(signal.SIGTERM)
    term_stdout, term_stderr = process.communicate(timeout=120)
    record = {"data": data, "model_dir": model_dir, "term_returncode": process.returncode,
              "term_stdout": term_stdout, "term_stderr": term_stderr}
    stopped = [line for line in term_stdout.splitlines() if line.startswith("stopped at step")]
    if process.returncode or len(stopped) != 1:
        return record  # test_sigterm_... reports it
    record["stopped_at"] = stopped_at = int(stopped[0].split()[3])

    # The same command again, killed once it has written a round checkpoint past the signal's;
    # oneDNN left to train.py's default (on). Its temporary files go to the test's own directory:
    # TensorFlow's autograph writes a file for each function it converts and removes them at exit,
    # which SIGKILL skips (they were left in /tmp by every run of the suite).
    killed_tmp = root / "killed-tmp"
    killed_tmp.mkdir()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", TMPDIR=str(killed_tmp))
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    deadline = time.time() + 300
    while (process.poll() is None and time.time() < deadline
           and int(read_history(model_dir)[-1]["step"]) <= stopped_at):
        time.sleep(0.2)
    record["kill_was_running"] = process.poll() is None
    process.send_signal(signal.SIGKILL)
    record["kill_output"] = process.communicate()[0]
    record["killed_history"] = read_history(model_dir)
    record["killed_at"] = killed_at = int(record["killed_history"][-1]["step"])

    # The last start with the user's choice of oneDNN off: train.py keeps it.
    record["final"] = run_train(*train_command(data, model_dir, "--steps", str(killed_at + 15),
                                               "--checkpoint-every", "10"), env={"TF_ENABLE_ONEDNN_OPTS": "0"})
    return record


@pytest.mark.slow
def test_sigterm_checkpoints_exits_0_then_sigkill_and_resume_continue(interrupted_run):
    run = interrupted_run
    stdout, stderr = run["term_stdout"], run["term_stderr"]
    assert run["term_returncode"] == 0, stdout[-2000:] + stderr[-2000:]
    stopped = [line for line in stdout.splitlines() if line.startswith("stopped at step")]
    assert len(stopped) == 1, stdout
    step = run["stopped_at"]
    assert 10 < step < 400, stopped  # mid-round, or right after a round's own checkpoint
    assert f"checkpoint ckpt-{step} written. Run the same command again to resume." in stopped[0]
    assert not [line for line in (stdout + stderr).splitlines() if any(n in line for n in NOISE)]
    # Non-interactive output: one line per checkpoint.
    assert stdout.splitlines()[0].startswith("step 10/400, loss ")

    # kill -9 after the resumed process's own checkpoint: the last complete one is kept.
    assert run["kill_was_running"], run["kill_output"][-3000:]
    assert f"resuming at step {step}" in run["kill_output"]
    # train.py turns TensorFlow's oneDNN kernels on (TensorFlow itself does only on CPUs with
    # AVX-512 VNNI or BF16, or AMX) unless the environment says otherwise, as the last start does.
    assert f"resuming at step {step}; TensorFlow's oneDNN kernels on" in run["kill_output"]
    killed_at = run["killed_at"]
    assert killed_at > step and killed_at % 10 == 0

    final = run["final"]
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    log = final.stdout + final.stderr
    assert f"resuming at step {killed_at}; TensorFlow's oneDNN kernels off" in final.stderr
    model_dir = run["model_dir"]
    results = json.loads((model_dir / "results.json").read_text())
    assert results["steps"] == killed_at + 15
    rows = read_history(model_dir)
    history = [int(row["step"]) for row in rows]
    # continues, no step repeated or lost; rounds stay on multiples of 10, a signal's checkpoint is extra
    assert history == list(range(10, killed_at + 16, 10)) + [killed_at + 15]
    # Each resumed part's minutes go on from the part before: they never go back, and
    # results.json's training minutes sum the parts (they restarted at 0 in each part).
    minutes = [float(row["minutes"]) for row in rows]
    assert minutes == sorted(minutes), minutes
    assert results["train_minutes"] >= minutes[-1]
    losses = [float(row["loss"]) for row in rows]
    # The loss continues from where it was, it does not restart from scratch.
    assert losses[len(run["killed_history"])] < losses[0]
    assert (model_dir / "curves.png").stat().st_size > 1000
    assert (model_dir / "final.weights.h5").exists()
    assert "valid BLEU (beam 4, averaged model)" in log
    if step % 10:  # a signal's mid-round checkpoint is never averaged; a round's own one may be
        assert f"ckpt-{step}" not in final.stderr.split("averaging")[1].splitlines()[0]


@pytest.mark.slow
def test_resume_refuses_other_tokenizer_or_config(interrupted_run, tmp_path):
    """The finished run, copied twice: resumed with another max_length, and with its tokenizer
    replaced by bytes that are no SentencePiece model; both refused in one line."""
    assert interrupted_run.get("final") is not None and interrupted_run["final"].returncode == 0
    data, steps = interrupted_run["data"], str(interrupted_run["killed_at"] + 20)
    other_dir, corrupted_dir = tmp_path / "run-other-config", tmp_path / "run-corrupted-tokenizer"
    shutil.copytree(interrupted_run["model_dir"], other_dir)
    shutil.copytree(interrupted_run["model_dir"], corrupted_dir)
    (corrupted_dir / "tokenizer.model").write_bytes(b"not a sentencepiece model")
    other = in_background(run_train, *train_command(data, other_dir, "--steps", steps, "--max-length", "32"))
    corrupt = in_background(run_train, *train_command(data, corrupted_dir, "--steps", steps))
    concurrent.futures.wait([other, corrupt])
    other, corrupt = other.result(), corrupt.result()
    assert other.returncode == 2
    assert other.stderr.strip().splitlines()[-1].startswith("train.py: error: ")
    assert "different model config (max_length)" in other.stderr

    assert corrupt.returncode == 2
    last = corrupt.stderr.strip().splitlines()[-1]
    assert "tokenizer.model" in last and "Traceback" not in corrupt.stderr


def test_train_py_and_export_translate_turn_onednn_on_unless_the_environment_chose():
    """`console.onednn_requested`: for `train.py` and `python -m export.translate`, an unset
    or empty `TF_ENABLE_ONEDNN_OPTS` asks for TensorFlow's oneDNN kernels, "0" or "1" is kept,
    other programs are left alone. The runs of `interrupted_run` check what TensorFlow then
    does: `test_sigterm_checkpoints_exits_0_then_sigkill_and_resume_continue`."""
    from keras_transformer import console

    ours = (["train.py", "--config", "tiny"], ["-u", "/repo/train.py"],
            ["-m", "export.translate", "--saved-model", "x"])
    others = (["-m", "pytest"], ["-c", "import train"], ["-m", "export.saved_model"], ["-m", "benchmarks.train_speed"],
              ["serve.py"], [])
    for argv in ours:
        assert console.onednn_requested(argv, {}) and console.onednn_requested(argv, {"TF_ENABLE_ONEDNN_OPTS": ""})
        for chosen in ("0", "1"):
            assert not console.onednn_requested(argv, {"TF_ENABLE_ONEDNN_OPTS": chosen}), (argv, chosen)
    for argv in others:
        assert not console.onednn_requested(argv, {}), argv


def test_help_explains_every_flag(short_commands):
    result = short_commands["test_help_explains_every_flag"].result()  # train.py --help
    assert result.returncode == 0
    for flag in ("--config", "--data", "--model-dir", "--steps", "--batch-tokens", "--jit-compile",
                 "--mixed-precision", "--seed", "--checkpoint-every", "--average"):
        assert flag in result.stdout


@pytest.mark.parametrize("flags", [["--help"], ["--steps", "0"], ["--batch-tokens", "32"]])
def test_help_and_flag_errors_answer_without_tensorflow(flags, tmp_path):
    """`train.py --help` and a flag the config refuses answer before anything imports Keras or
    TensorFlow (whose start-up alone is ~6.6 CPU s on a 2-vCPU EPYC): the interpreter's own
    import log (`-X importtime`) names the config module and neither of them."""
    result = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "train.py"),
                             "--model-dir", str(tmp_path / "m"), *flags],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == (0 if flags == ["--help"] else 2), result.stderr[-2000:]
    imported, _ = import_log(result.stderr)
    assert "keras_transformer.config" in imported
    assert not {"tensorflow", "keras", "numpy"} & imported
    assert not (tmp_path / "m").exists()


def test_run_file_refuses_a_replaced_tokenizer(tmp_path):
    """Resuming a run whose tokenizer.model was swapped for another valid one."""
    from keras_transformer import TransformerConfig
    from keras_transformer.data import Tokenizer, train_tokenizer
    from keras_transformer.run_dir import RunError, check_run_file

    texts = ["the man sees the dog", "der Mann sieht den Hund", "a red house", "ein rotes Haus"] * 30
    first = Tokenizer.load(train_tokenizer(texts, tmp_path / "a" / "tokenizer", 40))
    second = Tokenizer.load(train_tokenizer(texts[::-1] + ["other words here"] * 20, tmp_path / "b" / "tokenizer", 40))
    assert first.sha256 != second.sha256
    config = TransformerConfig.from_preset("tiny", vocab_size=first.vocab_size)
    check_run_file(tmp_path, config, first, {"data": "toy"})
    check_run_file(tmp_path, config, first, {"data": "toy"})  # the same run resumes
    with pytest.raises(RunError, match=rf"has sha256 {second.sha256[:12]}\.\.\., but the run in .* was trained "
                                       rf"with a tokenizer of sha256 {first.sha256[:12]}"):
        check_run_file(tmp_path, config, second, {"data": "toy"})


# Lines TensorFlow, absl and Keras print on their own that a normal run must not show.
# ("oneDNN custom operations are on ...": TensorFlow's own line; our log says whether they are.)
NOISE = ("absl::InitializeLog", "oneDNN custom operations", "cuda", "cuInit", "cpu_feature_guard", "WARNING",
         "Warning", "Sharding callback", "contains input name", "ran out of data", "shuffle=True", "Traceback",
         "INFO:tensorflow")


def test_the_quiet_rule_knows_our_commands_from_the_interpreters_command_line():
    from keras_transformer import console

    assert console.main_program(["-u", "-X", "dev", "-m", "export.saved_model", "--model-dir", "x"]) == (
        "module", "export.saved_model")
    assert console.main_program(["-B", "train.py", "-m", "x"]) == ("script", "train.py")
    assert console.main_program(["-c", "import train"]) is None and console.main_program([]) is None
    for ours in (["train.py", "--config", "tiny"], ["/repo/train.py"], ["-m", "benchmarks.loss"],
                 ["-mkeras_transformer.parsing"], ["-m", "export.tflite", "--verbose"]):
        assert console.running_command(ours), ours
    for theirs in (["-m", "pytest"], ["-c", "import train"], ["serve.py"], ["-m", "exporter.x"]):
        assert not console.running_command(theirs), theirs


@pytest.mark.parametrize("flags, expected", CLI_MISUSE)
def test_cli_misuse_is_one_line(short_commands, flags, expected):
    result, seconds = short_commands[tuple(flags)].result()  # run_cli_misuse(<a new directory>, flags)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("train.py: error: ") and expected in lines[0]
    assert seconds < 60
