import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    import keras
    keras.utils.set_random_seed(1234)
    yield
