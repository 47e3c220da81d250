import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# CTranslate2 picks its GEMM library by CPU vendor: Intel MKL on Intel CPUs, oneDNN on
# others. oneDNN's int8 GEMM lost precision on an AMD EPYC Zen 3 VM (AVX2, no AVX-512
# and so no VNNI): on the toy model the int8 log-probs were 0.0172 off float32's (median)
# against 0.0016 with MKL, which the PyPI wheel carries (docs/lab-notebook, serving speed
# part 12). The int8 test checks our conversion, not the CPU's int8 instructions, so the
# suite asks for MKL everywhere (read at CTranslate2's first GEMM, after this import;
# worker processes inherit it).
os.environ.setdefault("CT2_USE_MKL", "1")

import pytest  # noqa: E402


# `toy_translator`, the session's trained toy model, is in the root conftest.py (the docs'
# examples read it too).


@pytest.fixture(autouse=True)
def _seed():
    from helpers import TEST_SEED, seed_keeping_tensorflows_caches

    seed_keeping_tensorflows_caches(TEST_SEED)
    yield
