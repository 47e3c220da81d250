import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    import keras
    keras.utils.set_random_seed(1234)
    yield


@pytest.fixture(scope="session")
def toy_translator(tmp_path_factory):
    """One `helpers.train_toy_translator` run (seed 0, 250 steps) for the whole session:
    test_ctranslate2 converts it, test_export exports it (each module trained this same
    recipe for itself before). Tests only read the model; none trains or changes it.

    `{"model", "config", "tokenizer", "corpus", "data"}`; `data` is its toy corpus directory.
    """
    from helpers import train_toy_translator

    directory = tmp_path_factory.mktemp("toy_translator")
    model, config, tokenizer, corpus = train_toy_translator(directory)
    return {"model": model, "config": config, "tokenizer": tokenizer, "corpus": corpus,
            "data": directory / "data"}
