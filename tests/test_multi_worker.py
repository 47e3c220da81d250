"""Two worker processes under MultiWorkerMirroredStrategy on localhost (CPU) train
like one process on the same global batch (`enable_multi_worker_fit`)."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

WORKER = """
import json, os, sys
os.environ["KERAS_TRANSFORMER_QUIET"] = "1"
import keras_transformer
import keras, numpy as np, tensorflow as tf
from keras_transformer import LabelSmoothedCrossEntropy, TransformerConfig, build_transformer, make_optimizer
from keras_transformer.training.distribute import enable_multi_worker_fit, is_multi_worker

multi = "TF_CONFIG" in os.environ
strategy = tf.distribute.MultiWorkerMirroredStrategy() if multi else tf.distribute.get_strategy()
config = TransformerConfig.from_preset("tiny", vocab_size=40, num_layers=1, d_model=32, d_ff=64,
                                       warmup_steps=20, dropout=0.0)
rng = np.random.default_rng(0)
source = rng.integers(4, 40, size=(64, 6)).astype("int32")
target_in = np.concatenate([np.full((64, 1), 2, "int32"), source], axis=1)
target_out = np.concatenate([source, np.full((64, 1), 3, "int32")], axis=1)
ds = tf.data.Dataset.from_tensor_slices(((source, target_in), target_out)).batch(16).repeat()
halves = tf.data.Dataset.from_tensor_slices(((source, target_in), target_out)).batch(8).repeat()
losses = {}
# The paper's Adam, and plain SGD: Adam is invariant to a constant gradient scale, so only
# SGD tells a sum of the workers' gradients from their mean. Then the paper's Adam
# accumulating two half batches an update (train.py --accumulate 2): every sentence has as
# many tokens, so its updates are the whole batches' and each round's mean loss theirs.
for name, make, data, accumulate in (("adam", lambda: make_optimizer(config), ds, 1),
                                     ("sgd", lambda: keras.optimizers.SGD(0.5), ds, 1),
                                     ("adam_accumulated", lambda: make_optimizer(config, 2), halves, 2)):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = build_transformer(config)
        model.compile(optimizer=make(), loss=LabelSmoothedCrossEntropy(0.1))
    enable_multi_worker_fit(model, strategy)
    losses[name] = model.fit(data, epochs=3, steps_per_epoch=2 * accumulate, verbose=0).history["loss"]
print(json.dumps({"multi": is_multi_worker(strategy), "replicas": strategy.num_replicas_in_sync,
                  "loss": losses}))
"""


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def worker_env():
    """This process's environment for a worker process: without TF_CONFIG, TensorFlow's C++
    log lines off."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


def start_cluster(command, ports):
    """`command` started twice, as the two workers of a localhost cluster on `ports` (TF_CONFIG)."""
    cluster = [f"localhost:{port}" for port in ports]
    return [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(worker_env(), TF_CONFIG=json.dumps({"cluster": {"worker": cluster},
                                                                          "task": {"type": "worker", "index": i}})))
            for i in range(2)]


def start_workers(ports):
    """Two WORKER processes on a localhost cluster (the run alone, without TF_CONFIG, is
    `run_alone`'s in the test's process)."""
    return start_cluster([sys.executable, "-c", WORKER], ports), None


def write_train_only(directory, seed=0):
    """A toy corpus of 120 training pairs and no validation split."""
    from helpers import write_corpus

    data = write_corpus(directory, pairs=120, valid=4, seed=seed)
    for lang in ("en", "de"):
        (data / f"valid.{lang}").unlink()
    return data


def run_alone(monkeypatch, capsys):
    """WORKER in this process, without TF_CONFIG (one process, the default strategy): its
    printed JSON. It paid TensorFlow's and Keras's start-up in a process of its own before;
    the environment variable it sets is put back after."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("KERAS_TRANSFORMER_QUIET", "1")
    capsys.readouterr()
    exec(compile(WORKER, "<WORKER>", "exec"), {"__name__": "worker"})  # noqa: S102  (the test's own code)
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def start_train_py_workers(ports, tmp_path, early_stopping=False):
    """`train.py` run twice with TF_CONFIG (two workers on localhost) on a train-only toy
    corpus, under a time budget; with `early_stopping`, on a corpus with a validation split, a
    checkpoint every step, `--early-stopping 2` and a learning rate of 1e-30 (no validation
    loss ever lower than the first: the early-stopping test of test_training.py)."""
    from helpers import write_corpus

    data = (write_corpus(tmp_path / "data", pairs=120, valid=4) if early_stopping
            else write_train_only(tmp_path / "data"))
    model_dir = tmp_path / "run"
    command = [sys.executable, "train.py", "--data", str(data), "--model-dir", str(model_dir), "--steps", "9",
               "--vocab-size", "60", "--batch-tokens", "256", "--bleu-every-sentences", "0", "--no-export"]
    command += (["--checkpoint-every", "1", "--average", "1", "--beam-size", "1", "--early-stopping", "2",
                 "--set", "learning_rate_scale=1e-30"] if early_stopping else
                ["--checkpoint-every", "3", "--max-minutes", "0.0001"])
    return start_cluster(command, ports), model_dir


def start_fine_tuning_workers(ports, tmp_path):
    """A two-step `train.py` run in one process (waited for), then `train.py --init-from` it on
    another train-only corpus as two workers, at a learning rate of 1e-30: `(workers, (initial
    run directory, tuned run directory))`."""
    from helpers import write_corpus

    first, tuned = tmp_path / "first", tmp_path / "tuned"
    common = ["--vocab-size", "60", "--batch-tokens", "256", "--bleu-every-sentences", "0", "--no-export",
              "--average", "1"]
    initial = subprocess.run([sys.executable, "train.py", "--data", str(write_corpus(tmp_path / "data", pairs=120)),
                              "--model-dir", str(first), "--steps", "2", "--checkpoint-every", "2", *common],
                             cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert initial.returncode == 0, initial.stdout[-2000:] + initial.stderr[-3000:]
    command = [sys.executable, "train.py", "--data", str(write_train_only(tmp_path / "other", seed=1)),
               "--model-dir", str(tuned), "--init-from", str(first), "--steps", "2", "--checkpoint-every", "1",
               "--set", "learning_rate_scale=1e-30", "--set", "dropout=0", *common]
    return start_cluster(command, ports), (first, tuned)


@pytest.fixture(scope="module")
def process_waves(tmp_path_factory, request):
    """The tests' processes, started together (two workers a test and an initial run, nine
    processes that mostly pay TensorFlow's start-up, on two cores), only for the tests selected
    in this session: `{test name: what its start function returned}`. Each test awaits its own
    processes and checks them."""
    ports = free_ports(8)  # in one call: eight distinct ports, two per cluster
    starts = {"test_two_workers_train_like_one_process_on_the_same_global_batch":
                  lambda: start_workers(ports[:2]),
              "test_train_py_as_two_workers_writes_the_run_once":
                  lambda: start_train_py_workers(ports[2:4], tmp_path_factory.mktemp("train_py_workers")),
              "test_early_stopping_stops_two_workers_together":
                  lambda: start_train_py_workers(ports[4:6], tmp_path_factory.mktemp("early_workers"),
                                                 early_stopping=True),
              # (last: it waits for its initial run before it starts its workers)
              "test_fine_tuning_on_two_workers_starts_from_the_initial_runs_weights":
                  lambda: start_fine_tuning_workers(ports[6:], tmp_path_factory.mktemp("fine_tuning_workers"))}
    selected = {item.originalname for item in request.session.items if getattr(item, "module", None) is request.module}
    waves = {name: start() for name, start in starts.items() if name in selected}
    yield waves
    for workers, other in waves.values():  # any that a failed test left running
        for process in [*workers, *([other] if isinstance(other, subprocess.Popen) else [])]:
            if process.poll() is None:
                process.kill()
                process.communicate()


@pytest.mark.slow
def test_two_workers_train_like_one_process_on_the_same_global_batch(process_waves, monkeypatch, capsys):
    workers, _ = process_waves["test_two_workers_train_like_one_process_on_the_same_global_batch"]
    alone = run_alone(monkeypatch, capsys)  # (while the workers train)
    results = []
    for process in workers:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    first, second = results
    assert (first["multi"], first["replicas"], alone["multi"], alone["replicas"]) == (True, 2, False, 1)
    # Global batch 16: 8 sentences per worker, gradients all-reduced; no dropout. With SGD a
    # sum instead of a mean over the 2 workers doubles every step (issue #19).
    for optimizer in ("adam", "sgd"):
        assert first["loss"][optimizer] == second["loss"][optimizer]
        assert first["loss"][optimizer] == pytest.approx(alone["loss"][optimizer], rel=1e-5), optimizer
        assert first["loss"][optimizer][-1] < first["loss"][optimizer][0]
    # Accumulating two half batches an update on the two workers: one process's updates on
    # the whole batches (FusedAdam's cond in the cross-replica context under this strategy too).
    assert first["loss"]["adam_accumulated"] == second["loss"]["adam_accumulated"]
    assert first["loss"]["adam_accumulated"] == pytest.approx(alone["loss"]["adam"], rel=1e-5)


@pytest.mark.slow
def test_early_stopping_stops_two_workers_together(process_waves):
    """`train.py --early-stopping 2` on two workers: the chief counts from the history it alone
    writes and both stop at the same round, step 3 (rounds 2 and 3 without a lower validation
    loss than round 1's, by construction: a learning rate of 1e-30); the chief averages,
    evaluates and records it."""
    workers, model_dir = process_waves["test_early_stopping_stops_two_workers_together"]
    outputs = [process.communicate(timeout=400) for process in workers]
    for process, (out, err) in zip(workers, outputs):
        assert process.returncode == 0, out[-2000:] + err[-3000:]
    chief_out, worker_out = outputs[0][0], outputs[1][0]
    assert ("early stopping: the validation loss has not improved for 2 checkpoints (best at step 1); "
            "stopping at step 3") in chief_out
    assert "worker 1: trained to step 3; the chief averages, evaluates and exports" in worker_out
    results = json.loads((model_dir / "results.json").read_text())
    assert results["steps"] == 3 and results["stopped_early"] == {"step": 3, "best_step": 1, "patience": 2}
    history = (model_dir / "history.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in history[1:]] == ["1", "2", "3"]


@pytest.mark.slow
def test_fine_tuning_on_two_workers_starts_from_the_initial_runs_weights(process_waves):
    """`train.py --init-from` as two workers: both start from the initial run's averaged
    weights, so at a learning rate of 1e-30 (every Adam step under a float32 weight's spacing)
    the tuned run's final weights are the initial run's bit for bit (the single-process test
    of test_training.py, under MultiWorkerMirroredStrategy); the chief writes the run."""
    import h5py

    workers, (first, tuned) = process_waves["test_fine_tuning_on_two_workers_starts_from_the_initial_runs_weights"]
    outputs = [process.communicate(timeout=400) for process in workers]
    for process, (out, err) in zip(workers, outputs):
        assert process.returncode == 0, out[-2000:] + err[-3000:]
    assert "worker 1: trained to step 2; the chief averages, evaluates and exports" in outputs[1][0]
    assert json.loads((tuned / "results.json").read_text())["steps"] == 2
    assert json.loads((tuned / "run.json").read_text())["init_from"] == str(first.resolve())

    def arrays(path):
        found = {}

        def keep(name, item):
            if isinstance(item, h5py.Dataset):
                found[name] = item[()]

        with h5py.File(path, "r") as f:
            f.visititems(keep)
        return found

    initial, weights = arrays(first / "final.weights.h5"), arrays(tuned / "final.weights.h5")
    assert len(initial) > 10 and initial.keys() == weights.keys()
    for name in initial:
        np.testing.assert_array_equal(weights[name], initial[name], err_msg=name)


@pytest.mark.slow
def test_train_py_as_two_workers_writes_the_run_once(process_waves):
    """`train.py` run twice with TF_CONFIG (two workers on localhost): one run directory,
    written by the chief only (checkpoints, history, averaged weights, results); the
    time budget stops both workers at the same round. (Train split only: no BLEU;
    --no-export: the export comes after the non-chief has returned.)"""
    workers, model_dir = process_waves["test_train_py_as_two_workers_writes_the_run_once"]
    outputs = [process.communicate(timeout=400) for process in workers]
    for process, (out, err) in zip(workers, outputs):
        assert process.returncode == 0, out[-2000:] + err[-3000:]
    chief_out, worker_out = outputs[0][0], outputs[1][0]
    assert "worker 1: trained to step 3; the chief averages, evaluates and exports" in worker_out
    results = json.loads((model_dir / "results.json").read_text())
    assert results["steps"] == 3 and results["stopped_by_time_budget"] == 0.0001
    assert (model_dir / "final.weights.h5").exists() and results["averaged_checkpoints"] == 1
    assert sorted(p.name for p in (model_dir / "checkpoints").glob("ckpt-*.index")) == ["ckpt-3.index"]
    assert not list(model_dir.glob(".worker-*"))
    history = (model_dir / "history.csv").read_text().splitlines()
    assert len(history) == 2 and history[1].startswith("3,")  # one row, from the chief
    assert '"steps": 3' in chief_out and '"steps"' not in worker_out  # results printed by the chief only


def test_a_malformed_tf_config_is_a_one_line_error_not_a_single_process_run(monkeypatch):
    """A TF_CONFIG that was no JSON, or named a task its cluster lacks, counted as none: that
    worker trained alone as a single process (`train.py` ran 1 step and exported, 2026-12-01),
    while the others waited for it. Now `cluster_tasks` (which `train_and_evaluate` asks before
    anything else) refuses it in one line naming what to give; the forms that mean one process
    still do."""
    from keras_transformer.training.distribute import cluster_tasks
    from keras_transformer.run_dir import RunError

    two = {"worker": ["localhost:1", "localhost:2"]}
    for value, count in (("", 0), ("  ", 0), ('{"cluster": {}, "task": {}}', 0),
                         (json.dumps({"cluster": {"worker": ["localhost:1"]}}), 1),
                         (json.dumps({"cluster": two, "task": {"type": "worker", "index": 1}}), 2),
                         (json.dumps({"cluster": {"chief": ["localhost:0"], **two},
                                      "task": {"type": "chief", "index": 0}}), 3)):
        monkeypatch.setenv("TF_CONFIG", value)
        assert cluster_tasks() == count, value
    for value, message in (
            ("{bad json", r"^TF_CONFIG is not valid JSON \(Expecting property name .*\); give \{\"cluster\": "
                          r"\{\"worker\": \[\"HOST:PORT\", \.\.\.\]\}, \"task\": \{\"type\": \"worker\", \"index\": I\}\}, "
                          r"I this worker's place in the list, or unset it to train in one process$"),
            ("[1]", r"^TF_CONFIG=\[1\] is not of the form \{\"cluster\""),
            ('{"cluster": {"worker": "localhost:1"}}', r"is not of the form"),
            (json.dumps({"cluster": two, "task": {"type": "worker", "index": 2}}),
             r"^TF_CONFIG's task \{\"type\": \"worker\", \"index\": 2\} is none of its cluster's tasks "
             r"\(\{\"worker\": 2\}\); give each worker its own type and index \(0-based\)$"),
            (json.dumps({"cluster": two}), r"^TF_CONFIG's task \{\} is none of its cluster's tasks"),
            (json.dumps({"cluster": two, "task": {"type": "chief", "index": 0}}), r"is none of its cluster's"),
            (json.dumps({"cluster": two, "task": {"type": "worker", "index": True}}), r"is none of its cluster's")):
        monkeypatch.setenv("TF_CONFIG", value)
        with pytest.raises(RunError, match=message):
            cluster_tasks()
