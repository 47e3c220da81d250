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


@pytest.fixture(autouse=True)
def _seed():
    import keras
    keras.utils.set_random_seed(1234)
    yield


@pytest.fixture(scope="session")
def toy_translator(tmp_path_factory):
    """One `helpers.train_toy_translator` run (250 steps, seed 0 plus
    `$KERAS_TRANSFORMER_TEST_SEED`) for the whole session: test_ctranslate2 converts it, test_export exports it (each module trained this same
    recipe for itself before). Tests only read the model; none trains or changes it.

    `{"model", "config", "tokenizer", "corpus", "data"}`; `data` is its toy corpus directory.
    """
    from helpers import train_toy_translator

    directory = tmp_path_factory.mktemp("toy_translator")
    model, config, tokenizer, corpus = train_toy_translator(directory)
    return {"model": model, "config": config, "tokenizer": tokenizer, "corpus": corpus,
            "data": directory / "data"}
