"""The documentation's Python examples as tests (Sybil): every ```python block of README.md
and docs/ (the dated archive docs/lab-notebook/ aside) runs, and a block of `>>>` lines checks
its printed values.

* A block that needs what no test can make quickly (a 3-minute training run, a LiteRT
  interpreter in the test process, a parser trained for 25 minutes) is preceded by
  `<!-- skip: next -->`.
* The examples of docs/export.md run in a directory holding `runs/default`: a trained run
  directory of the tests' toy model (tokenizer, run.json, final.weights.h5) and its export,
  made once per worker (`docs_run`), so `runs/default/export/1` is a real SavedModel.
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
def docs_run(tmp_path_factory):
    """A directory holding `runs/default`: the toy model of `tests/helpers.py` (trained for a
    few seconds) as a `train.py` run directory, exported to `runs/default/export/1`."""
    from tests.helpers import train_toy_translator

    from export.saved_model import export_model
    from keras_transformer.run_dir import FINAL_WEIGHTS, check_run_file

    directory = tmp_path_factory.mktemp("docs")
    model, config, tokenizer, _ = train_toy_translator(directory / "toy")
    run = directory / "runs" / "default"
    run.mkdir(parents=True)
    (run / "tokenizer.model").write_bytes(tokenizer.model_bytes)
    check_run_file(run, config, tokenizer, {"data": "toy", "source_lang": "en", "target_lang": "de"})
    model.save_weights(run / FINAL_WEIGHTS)
    export_model(model, config, tokenizer, run / "export")
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
