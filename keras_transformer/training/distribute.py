"""Training on several devices and workers: the strategy, the chief, collectives
across workers, and the patch that lets Keras's `fit` run under
`MultiWorkerMirroredStrategy` (TensorFlow-only code, like `training`)."""

from __future__ import annotations

import json
import os
import time

import tensorflow as tf

from keras_transformer import run_dir


def is_multi_worker(strategy) -> bool:
    """Whether `strategy` spans several worker processes (MultiWorkerMirroredStrategy)."""
    extended = getattr(strategy, "extended", None)
    return bool(getattr(extended, "_in_multi_worker_mode", lambda: False)())


def enable_multi_worker_fit(model, strategy) -> None:
    """Makes `model.fit` run under `MultiWorkerMirroredStrategy` (Keras 3.15, TF 2.21).

    Keras's TensorFlow trainer fails there in two places (keras-team/keras#20585):

    1. before the first step, `_maybe_symbolic_build` reduces the first
       distributed batch with `strategy.reduce("MEAN", ...)` to get shapes,
       which the collective strategy cannot do on a per-replica int batch
       ("Attempt to convert a value (PerReplica...) to a Tensor"): here the
       model is built from this worker's first local batch instead (shapes
       are all it needs);
    2. after every step, the step's logs are reduced with
       `strategy.reduce("MEAN", v, axis=0)`, which fails for the scalar loss
       and metrics ("Invalid reduction dimension 0 for input with 0
       dimensions"): here multi-worker "auto"/"mean" reductions of per-replica
       logs use `axis=None` (logs that are plain tensors pass as they are). This patches Keras's module function (private API,
       checked against Keras 3.15.1), only once a multi-worker strategy is used.

    Gradients are all-reduced by the optimizer as usual; with these two
    changes two workers on localhost give the same losses as one process on
    the same global batch (tests/test_training.py).
    """
    if not is_multi_worker(strategy):
        return
    from keras import tree
    from keras.src.backend.tensorflow import trainer as keras_trainer

    def local_first(x):
        return strategy.experimental_local_results(x)[0] if isinstance(x, tf.distribute.DistributedValues) else x

    def build_from_local_batch(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tree.map_structure(local_first, next(batches))
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = build_from_local_batch
    original = keras_trainer.reduce_per_replica
    if getattr(original, "_keras_transformer_patch", False):
        return

    def reduce_per_replica(values, strategy_, reduction):
        if keras_trainer._collective_all_reduce_multi_worker(strategy_) and reduction in ("auto", "mean"):
            return tree.map_structure(
                lambda v: strategy_.reduce("MEAN", v, axis=None) if keras_trainer._is_per_replica_instance(v)
                else v, values)
        return original(values, strategy_, reduction)

    reduce_per_replica._keras_transformer_patch = True
    keras_trainer.reduce_per_replica = reduce_per_replica


# What `TF_CONFIG` holds, for the messages that refuse a malformed one.
TF_CONFIG_FORM = ('{"cluster": {"worker": ["HOST:PORT", ...]}, "task": {"type": "worker", "index": I}}, '
                  'I this worker\'s place in the list')


def cluster_tasks():
    """The number of worker tasks `TF_CONFIG` names (0 when unset or empty).

    Raises `run_dir.RunError` in one line when it is set but is no JSON object of that
    form, or when a cluster of several tasks has no `task` among them: a malformed
    TF_CONFIG had counted as none, so that worker trained alone, as a single process,
    while the others waited for it."""
    text = os.environ.get("TF_CONFIG", "")
    if not text.strip():
        return 0
    try:
        config = json.loads(text)
    except ValueError as error:
        raise run_dir.RunError(f"TF_CONFIG is not valid JSON ({error}); give {TF_CONFIG_FORM}, or unset it "
                               f"to train in one process") from None
    cluster = config.get("cluster", {}) if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not all(isinstance(hosts, list) for hosts in cluster.values()):
        raise run_dir.RunError(f"TF_CONFIG={text[:200]} is not of the form {TF_CONFIG_FORM}")
    tasks = sum(len(cluster.get(kind, [])) for kind in ("chief", "worker"))
    task = config.get("task", {})
    kind, index = (task.get("type"), task.get("index")) if isinstance(task, dict) else (None, None)
    if tasks > 1 and (kind not in cluster or isinstance(index, bool) or not isinstance(index, int)
                      or not 0 <= index < len(cluster[kind])):
        sizes = json.dumps({name: len(hosts) for name, hosts in cluster.items()})
        raise run_dir.RunError(f"TF_CONFIG's task {json.dumps(task)} is none of its cluster's tasks ({sizes}); "
                               f"give each worker its own type and index (0-based)")
    return tasks


def make_strategy():
    """MultiWorkerMirroredStrategy when `TF_CONFIG` names several workers (create it
    before any other TensorFlow op); MirroredStrategy over all visible GPUs; else the
    default strategy on one device."""
    if cluster_tasks() > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([gpu.name for gpu in gpus])
    return tf.distribute.get_strategy()


def is_chief(strategy) -> bool:
    """The task that writes the run directory: the only one, or the multi-worker chief."""
    if not is_multi_worker(strategy):
        return True
    resolver = strategy.cluster_resolver
    return resolver.task_type == "chief" or (
        resolver.task_type == "worker" and resolver.task_id == 0
        and "chief" not in resolver.cluster_spec().as_dict())


def any_worker(strategy, flag: bool) -> bool:
    """`flag` OR-ed over all workers (a collective: every worker must call it at the same point)."""
    if not is_multi_worker(strategy):
        return bool(flag)
    value = strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
        "SUM", tf.constant(1.0 if flag else 0.0)))
    return bool(strategy.experimental_local_results(value)[0].numpy() > 0)


def wait_for_tokenizer(model_dir, timeout_seconds=600):
    """A non-chief worker's tokenizer: the chief's `tokenizer.model` in the shared `model_dir`."""
    from keras_transformer.data import Tokenizer, tokenizer_path

    path = tokenizer_path(model_dir)
    deadline = time.time() + timeout_seconds
    while not path.exists():
        if time.time() > deadline:
            raise run_dir.RunError(
                f"{path} did not appear within {timeout_seconds} s: the chief writes it; give every worker "
                f"the same --model-dir on a shared file system (or copy the chief's tokenizer.model there)")
        time.sleep(1)
    time.sleep(1)  # written atomically by the chief; settle
    return Tokenizer.load(path)
