"""Two worker processes under MultiWorkerMirroredStrategy on localhost (CPU) train
like one process on the same global batch (`enable_multi_worker_fit`)."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

WORKER = """
import json, os, sys
os.environ["KERAS_TRANSFORMER_QUIET"] = "1"
import keras_transformer
import keras, numpy as np, tensorflow as tf
from keras_transformer import LabelSmoothedCrossEntropy, TransformerConfig, build_transformer, make_optimizer
from keras_transformer.training import enable_multi_worker_fit, is_multi_worker

multi = "TF_CONFIG" in os.environ
strategy = tf.distribute.MultiWorkerMirroredStrategy() if multi else tf.distribute.get_strategy()
config = TransformerConfig.from_preset("tiny", vocab_size=40, num_layers=1, d_model=32, d_ff=64,
                                       warmup_steps=20, dropout=0.0)
rng = np.random.default_rng(0)
source = rng.integers(4, 40, size=(64, 6)).astype("int32")
target_in = np.concatenate([np.full((64, 1), 2, "int32"), source], axis=1)
target_out = np.concatenate([source, np.full((64, 1), 3, "int32")], axis=1)
ds = tf.data.Dataset.from_tensor_slices(((source, target_in), target_out)).batch(16).repeat()
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = build_transformer(config)
    model.compile(optimizer=make_optimizer(config), loss=LabelSmoothedCrossEntropy(0.1))
enable_multi_worker_fit(model, strategy)
history = model.fit(ds, epochs=3, steps_per_epoch=2, verbose=0)
print(json.dumps({"multi": is_multi_worker(strategy), "replicas": strategy.num_replicas_in_sync,
                  "loss": history.history["loss"]}))
"""


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_worker(env):
    return subprocess.Popen([sys.executable, "-c", WORKER], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_two_workers_train_like_one_process_on_the_same_global_batch():
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    cluster = [f"localhost:{port}" for port in free_ports(2)]
    workers = [run_worker(dict(env, TF_CONFIG=json.dumps({"cluster": {"worker": cluster},
                                                           "task": {"type": "worker", "index": i}})))
               for i in range(2)]
    single = run_worker(env)
    results = []
    for process in [*workers, single]:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    first, second, alone = results
    assert (first["multi"], first["replicas"], alone["multi"], alone["replicas"]) == (True, 2, False, 1)
    # Global batch 16: 8 sentences per worker, gradients all-reduced; no dropout.
    assert first["loss"] == second["loss"]
    assert first["loss"] == pytest.approx(alone["loss"], rel=1e-5)
    assert first["loss"][-1] < first["loss"][0]
