"""The documentation's Python examples as tests (Sybil): every ```python block of README.md
and docs/ (the dated archive docs/lab-notebook/ aside) runs, and a block of `>>>` lines checks
its printed values.

* A block that needs what no test can make quickly (a 3-minute training run, a LiteRT
  interpreter in the test process, a parser trained for 25 minutes) is preceded by
  `<!-- skip: next -->`.
* The examples of docs/export.md run in a directory holding `runs/default`: a trained run
  directory of the tests' toy model (tokenizer, run.json, final.weights.h5) and its export,
  made once per worker (`docs_run`, from the suite's `toy_translator`), so
  `runs/default/export/1` is a real SavedModel.
* A block preceded by `<!-- slow -->` is marked `slow`, as the suite's other long checks.
"""

import re

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

SLOW_COMMENT = "<!-- slow -->"
# The pages whose examples read `runs/default`.
NEED_A_RUN = ["docs/export.md"]


@pytest.fixture(scope="session")
def toy_translator(tmp_path_factory):
    """One `tests/helpers.train_toy_translator` run (250 steps, seed 0 plus
    `$KERAS_TRANSFORMER_TEST_SEED`) for the whole session: test_ctranslate2 converts it,
    test_export exports it, the docs' examples read it (`docs_run`). Tests only read the
    model; none trains or changes it.

    Under pytest-xdist the first worker that needs it trains it and leaves it as a run
    directory (tokenizer, run.json, final weights) beside the workers' temporary
    directories; the others wait for that (a lock file) and load it (`load_trained`), the
    same weights, instead of training the same model again (each worker trained its own).

    `{"model", "config", "tokenizer", "corpus", "data"}`; `data` is its toy corpus directory.
    """
    import os
    import shutil

    from tests.helpers import train_toy_translator

    try:
        import fcntl
    except ImportError:  # (no fcntl, as on Windows: each worker trains its own)
        fcntl = None
    if os.environ.get("PYTEST_XDIST_WORKER") is None or fcntl is None:
        directory = tmp_path_factory.mktemp("toy_translator")
        model, config, tokenizer, corpus = train_toy_translator(directory)
        return {"model": model, "config": config, "tokenizer": tokenizer, "corpus": corpus,
                "data": directory / "data"}
    from keras_transformer.data import load_corpus
    from keras_transformer.run_dir import FINAL_WEIGHTS, check_run_file, load_trained

    directory = tmp_path_factory.getbasetemp().parent / "toy_translator"  # this session's, every worker's
    run, done = directory / "run", directory / "complete"
    with open(directory.with_name("toy_translator.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if done.exists():
            model, config, tokenizer = load_trained(run)
            corpus = load_corpus(str(directory / "data"), "en", "de")
        else:
            shutil.rmtree(directory, ignore_errors=True)  # what a worker that failed here left
            model, config, tokenizer, corpus = train_toy_translator(directory)
            run.mkdir()
            (run / "tokenizer.model").write_bytes(tokenizer.model_bytes)
            check_run_file(run, config, tokenizer, {"data": "toy", "source_lang": "en", "target_lang": "de"})
            model.save_weights(run / FINAL_WEIGHTS)
            done.touch()  # last: a worker that failed before here leaves the next one to train
    return {"model": model, "config": config, "tokenizer": tokenizer, "corpus": corpus, "data": directory / "data"}


# The signatures the examples of the `NEED_A_RUN` pages call (each one more traced is seconds).
DOCS_SIGNATURES = ("translate_options", "translate_advanced")


@pytest.fixture(scope="session")
def docs_run(toy_translator, tmp_path_factory):
    """A directory holding `runs/default`: the session's toy model (`toy_translator`) as a
    `train.py` run directory, exported to `runs/default/export/1` with the signatures the
    examples call (`DOCS_SIGNATURES`)."""
    from export.saved_model import export_model
    from keras_transformer.run_dir import FINAL_WEIGHTS, check_run_file

    directory = tmp_path_factory.mktemp("docs")
    model, config, tokenizer = (toy_translator[k] for k in ("model", "config", "tokenizer"))
    run = directory / "runs" / "default"
    run.mkdir(parents=True)
    (run / "tokenizer.model").write_bytes(tokenizer.model_bytes)
    check_run_file(run, config, tokenizer, {"data": "toy", "source_lang": "en", "target_lang": "de"})
    model.save_weights(run / FINAL_WEIGHTS)
    export_model(model, config, tokenizer, run / "export", signatures=DOCS_SIGNATURES)
    return directory


@pytest.fixture
def in_docs_run(docs_run, monkeypatch):
    monkeypatch.chdir(docs_run)


_parsers = [PythonCodeBlockParser(), SkipParser()]
pytest_collect_file = (
    Sybil(parsers=_parsers, patterns=["README.md", "docs/*.md", "docs/**/*.md"],
          excludes=["docs/lab-notebook/*", *NEED_A_RUN], name="docs")
    + Sybil(parsers=_parsers, patterns=NEED_A_RUN, fixtures=["in_docs_run"], name="docs-with-a-run")
).pytest()


def pytest_collection_modifyitems(items):
    for item in items:
        example = getattr(item, "example", None)
        if example is None:
            continue
        before = example.document.text[:example.start].rstrip().rsplit("\n", 1)[-1]
        if re.fullmatch(re.escape(SLOW_COMMENT), before.strip()):
            item.add_marker(pytest.mark.slow)
