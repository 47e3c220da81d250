"""The decoding goldens (issue #91): every search loop's ids and scores, the XLA programs
traced, each exported signature's op multiset and `benchmarks.step_nodes`' nodes per step,
computed again and compared with `tests/data/decoding_goldens.json`, recorded at the
commit before the decoding code was restructured (`python -m tests.record_goldens`; what
each golden is: that module's docstring)."""

import contextlib
import json
import tempfile

import numpy as np
import pytest
import record_goldens as goldens_module

RECORDED = json.loads(goldens_module.GOLDENS.read_text())
# Scores: float32 sums of up to 14 log-probabilities (|score| <= ~15), summed in another order
# by another kernel on another CPU (Intel against AMD, oneDNN against Eigen) they move in the
# last bits of each term: 1e-5 relative and absolute holds them (the run-time options' graph
# against the python values' keeps to rtol 1e-6, tests/test_constraints.py; translate_xla's
# against serving_default's needed 1e-5, tests/test_export.py). The ids are compared exactly:
# the recorder checked that no logit moved by up to 1e-4 (100 times a CPU's difference)
# changes any of them (`record_goldens.check_margins`).
SCORE_TOLERANCE = dict(rtol=1e-5, atol=1e-5)


@contextlib.contextmanager
def grappler_on():
    """Grappler's meta optimizer on, as in a fresh process (where the goldens were recorded),
    put back as it was after: `export.translate --xla` turns it off process-wide, and a test
    that runs it in-process before this module, in the same worker, left it off (the step
    nodes then counted 299 AddV2 and no AddN: the arithmetic optimizer had not merged them)."""
    import tensorflow as tf

    was = tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False)
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": was})


@pytest.fixture(scope="module")
def computed():
    with tempfile.TemporaryDirectory() as directory, grappler_on():
        goldens, model = goldens_module.compute(directory)
        goldens["step_nodes"] = {goldens_module.onednn_key(): goldens_module.step_nodes_goldens(model, directory)}
    return goldens


def test_the_random_model_is_the_recordings(computed):
    """The goldens are one random model's: weights from other seeds or another Keras
    initialiser are a re-recording, not a change of the decoding code."""
    assert computed["weights_sha256"] == RECORDED["weights_sha256"], (
        "the golden model's weights changed (Keras or the model's layers): re-record at a commit whose decoding "
        "is known good (docs/development.md, Tests)")


def test_every_search_loop_finds_the_recorded_ids_and_scores(computed):
    """The plain graph's loop, the static buffer's, search_litert at a batch and at one
    sentence, and search_xla; python-valued and run-time options; no constraint, each
    constraint, a prefix, sampling; beam 1 and 4; one result and several."""
    searches, recorded = computed["searches"], RECORDED["searches"]
    assert sorted(searches) == sorted(recorded)
    changed = []
    for name, want in recorded.items():
        ids, scores = np.array(searches[name]["ids"]), np.array(searches[name]["scores"])
        if ids.shape != np.shape(want["ids"]) or (ids != np.array(want["ids"])).any():
            changed.append(f"{name}: ids {ids.tolist()} != {want['ids']}")
        elif not np.allclose(scores, want["scores"], **SCORE_TOLERANCE):
            changed.append(f"{name}: scores {scores.tolist()} != {want['scores']}")
    assert not changed, f"{len(changed)} of {len(recorded)} searches changed:\n" + "\n".join(changed)


def test_search_xla_traces_the_recorded_programs_with_their_ops(computed):
    """The programs `search_xla` traced (`(beam, results, halvings, folded[, constraints])`),
    each once, and each program's op multiset."""
    assert computed["xla_programs"] == RECORDED["xla_programs"]


def test_each_exported_signature_holds_the_recorded_ops(computed):
    """Each signature of an export of all signatures: the op types and counts of its
    function and the functions it calls, in `saved_model.pb`."""
    got, want = computed["signature_ops"], RECORDED["signature_ops"]
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], (name, {op: (got[name].get(op), want[name].get(op))
                                                for op in set(got[name]) | set(want[name])
                                                if got[name].get(op) != want[name].get(op)})


def test_step_nodes_counts_the_recorded_nodes_per_step(computed):
    """`benchmarks.step_nodes`' loop steps and nodes run by op type (batch 1 and 4), for this
    process's oneDNN setting (TensorFlow's graph rewrite changes the op types that run)."""
    key = goldens_module.onednn_key()
    if key not in RECORDED["step_nodes"]:
        pytest.skip(f"no step nodes recorded with {key}")
    assert computed["step_nodes"][key] == RECORDED["step_nodes"][key]
