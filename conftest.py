"""The documentation's Python examples as tests (Sybil): every ```python block of README.md
and docs/ (the dated archive docs/lab-notebook/ aside) runs, and a block of `>>>` lines checks
its printed values. A block that needs a trained run, data files or a server is preceded by
`<!-- skip: next -->`; one that takes more than a few seconds by `<!-- slow -->`, which marks
it `slow` as the suite's other long checks."""

import re

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

SLOW_COMMENT = "<!-- slow -->"

pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), SkipParser()],
    patterns=["README.md", "docs/*.md", "docs/**/*.md"],
    excludes=["docs/lab-notebook/*"],
).pytest()


def pytest_collection_modifyitems(items):
    for item in items:
        example = getattr(item, "example", None)
        if example is None:
            continue
        before = example.document.text[:example.start].rstrip().rsplit("\n", 1)[-1]
        if re.fullmatch(re.escape(SLOW_COMMENT), before.strip()):
            item.add_marker(pytest.mark.slow)
