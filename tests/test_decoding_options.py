"""Tests of keras_transformer.decoding.options: the one table of decoding options, and that
each surface (SearchOptions, the signatures, export.translate, the CTranslate2 mapping, the
docs) is made from it."""

import ast
import dataclasses
import math
import pathlib

import numpy as np
import pytest

from keras_transformer.decoding import options as decoding_options
from keras_transformer.decoding.options import BY_NAME, OPTIONS, Range


def test_the_table_imports_neither_tensorflow_nor_keras():
    """A command's `--help` and flag errors come from the table before TensorFlow loads: it
    imports the standard library and `keras_transformer.constants` alone (test_command_help
    runs the commands)."""
    tree = ast.parse(pathlib.Path(decoding_options.__file__).read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"__future__", "dataclasses", "math", "numbers", "typing", "keras_transformer.constants"}
    constants = (pathlib.Path(decoding_options.__file__).parents[1] / "constants.py").read_text(encoding="utf-8")
    assert "import" not in constants


@pytest.mark.parametrize("bound, inside, outside", [
    (Range(0), [0, 3, 1e9], [-1, -0.5, float("nan")]),
    (Range(0, 1, low_open=True), [1e-9, 0.5, 1], [0, 1.0001, -1, float("nan")]),
    (Range(0, low_open=True, finite=True), [1e-9, 7], [0, float("inf"), float("nan")]),
    (Range(0, 2 ** 31, high_open=True), [0, 2 ** 31 - 1], [2 ** 31, -1]),
])
def test_a_range_holds_the_same_values_in_python_and_as_a_tensor_mask(bound, inside, outside):
    """`Range.holds` (python values) and `Range.outside` (a NumPy array, as a graph's tensor)
    agree value by value, NaN outside any bounded range; the integral form (the bounds broken,
    the ops `translate_advanced` had for its int options) agrees where there is no NaN."""
    values = np.array(inside + outside, np.float64)
    mask = bound.outside(values, np.isfinite)
    assert [bool(m) for m in mask] == [False] * len(inside) + [True] * len(outside)
    assert [bound.holds(v) for v in inside + outside] == [True] * len(inside) + [False] * len(outside)
    numbers = ~np.isnan(values)  # an integral option's mask (no NaN): the bounds broken
    np.testing.assert_array_equal(bound.outside(values[numbers], np.isfinite, integral=True) | ~np.isfinite(
        values[numbers]) if bound.finite else bound.outside(values[numbers], np.isfinite, integral=True),
        mask[numbers])


def test_search_options_raise_the_rows_messages():
    """`SearchOptions` checks each option by its row: the message names the value and the
    python and tensor forms the row takes."""
    from keras_transformer.decoding import SearchOptions

    for name, bad in (("min_length", -1), ("min_length", 2.5), ("no_repeat_ngram_size", -2),
                      ("disallow_unk", "yes"), ("sampling_topk", -1), ("sampling_topp", 1.5),
                      ("sampling_temperature", 0.0), ("seed", 2 ** 31), ("alpha", float("nan")),
                      ("patience", float("inf")), ("repetition_penalty", 0.0), ("repetition_penalty", float("nan")),
                      ("repetition_penalty", -1.5), ("suppress_sequences", [["a"]]), ("suppress_sequences", [[-1]]),
                      ("suppress_sequences", "ab")):
        row = BY_NAME[name]
        with pytest.raises(ValueError) as raised:
            SearchOptions(beam_size=1, **{name: bad})
        assert str(raised.value) == f"{name} must be {row.python_text} or {row.tensor_text}, got {bad!r}"
    options = SearchOptions(beam_size=1, min_length=np.int64(3), disallow_unk=np.bool_(True), sampling_topp=1)
    assert type(options.min_length) is int and options.disallow_unk is True and type(options.sampling_topp) is float


def test_search_options_fields_defaults_and_docstring_are_the_rows():
    """`SearchOptions` is made from the table: one keyword-only field per row, in its order, with
    the row's python default (then the loop's own fields), and each row's words in its
    docstring; a new row is a new field with nothing else to edit."""
    from keras_transformer.decoding import SearchOptions

    fields = dataclasses.fields(SearchOptions)
    assert [field.name for field in fields] == [row.name for row in OPTIONS] + ["exact_results", "max_beam_size"]
    assert all(field.kw_only for field in fields)
    made = SearchOptions()
    assert [getattr(made, row.name) for row in OPTIONS] == [row.search_default for row in OPTIONS]
    # (a python search's own: the paper's beam and alpha, the exact search, the config's extra length)
    assert (made.beam_size, made.alpha, made.patience, made.extra_length, made.num_results) == (4, 0.6, None, None, 1)
    assert made.suppress_sequences == () and made.repetition_penalty == 1.0 and made.seed == 0
    words = " ".join(SearchOptions.__doc__.split())
    for row in OPTIONS:
        assert f"{row.name}: {' '.join(row.doc.split())}" in words, row.name
    with pytest.raises(TypeError, match="positional"):
        SearchOptions(4)
    # python values stored as the row's kind, or as given (`as_given`: alpha 1 stays the int 1)
    made = SearchOptions(beam_size=np.int64(2), num_results=2, alpha=1, sampling_temperature=2, extra_length=3.0)
    assert (type(made.beam_size), made.alpha, type(made.alpha), type(made.sampling_temperature),
            made.extra_length) == (int, 1, int, float, 3.0)


def test_export_translate_has_a_flag_for_each_row_with_one_and_checks_it():
    """`export.translate`'s decoding flags, translate_options' (`--beam-size`, `--alpha`,
    `--n-best`, `--patience`) and translate_advanced's, are the rows' (flag, help with an older
    export's default, the option's name as the flag's dest), and each flag's error is its row's
    `flag_problem`."""
    from export import translate

    parser = translate.build_parser()
    actions = {action.dest: action for action in parser._actions}
    flagged = [row for row in OPTIONS if row.flag]
    assert [row.flag for row in flagged[:4]] == ["--beam-size", "--alpha", "--n-best", "--patience"]
    assert all(row in decoding_options.ADVANCED for row in flagged[4:])
    for row in flagged:
        assert actions[row.name].option_strings == [row.flag]
        assert actions[row.name].help == row.flag_help(translate.PAPER) and "{default}" not in actions[row.name].help
        if row.flag_range is not None:
            bad = -1 if row.flag_range.low == 0 and not row.flag_range.low_open else (
                row.flag_range.low if row.flag_range.low_open else row.flag_range.high + 1)
            assert row.flag_problem(bad) == f"{row.flag} must be {row.flag_text}, got {bad}"
    assert f"{translate.PAPER.beam_size} for exports older" in actions["beam_size"].help
    assert f"{translate.PAPER.length_penalty_alpha} for older exports" in actions["alpha"].help
    # the plain search's flags: --n-best's default is its row's (1), the others None (the export's own)
    assert [actions[name].default for name in ("beam_size", "alpha", "num_results", "patience")] == [
        None, None, 1, None]
    assert all(actions[row.name].default in (None, False) for row in decoding_options.ADVANCED)


def test_served_defaults_and_ctranslate2_names_come_from_the_rows():
    """The signatures' defaults are the rows' (the export's own where the row has none), and
    `translation_options` maps our names to the rows' CTranslate2 names."""
    from export.ctranslate2 import translation_options
    from keras_transformer import TransformerConfig

    config = TransformerConfig(beam_size=3, length_penalty_alpha=0.7, decode_extra_length=9, max_length=20)
    defaults = decoding_options.served_defaults("translate_advanced", config, patience=1.5)
    assert list(defaults) == [row.name for row in OPTIONS]
    assert {k: defaults[k] for k in ("beam_size", "alpha", "extra_length", "patience")} == {
        "beam_size": 3, "alpha": 0.7, "extra_length": 9, "patience": 1.5}
    assert all(defaults[row.name] == row.default for row in OPTIONS
               if row.default is not None and row.kind != "sequences")
    assert defaults["suppress_sequences"] == ""  # (served: a string of pieces, "" for none)
    assert list(decoding_options.served_defaults("translate_options", config)) == [
        "beam_size", "alpha", "extra_length", "num_results", "patience"]
    options = translation_options(config, 5, beam_size=2, no_repeat_ngram_size=2, sampling_topk=4)
    assert {k: options[k] for k in ("beam_size", "patience", "min_decoding_length", "no_repeat_ngram_size",
                                    "disable_unk", "sampling_topk")} == {
        "beam_size": 2, "patience": 2.0, "min_decoding_length": 0, "no_repeat_ngram_size": 2, "disable_unk": False,
        "sampling_topk": 4}
    with pytest.raises(TypeError, match="seed"):
        translation_options(config, 5, seed=3)  # (no CTranslate2 option of that name)
    assert math.isfinite(options["length_penalty"])


def test_the_reference_page_holds_the_table():
    """docs/reference/options.md's decoding table is `markdown_table()` (`python -m tools.reference`)."""
    from tools.reference import OPTIONS_PAGE

    page = OPTIONS_PAGE.read_text(encoding="utf-8")
    table = page.split("<!-- decoding-options:begin -->\n", 1)[1].split("<!-- decoding-options:end -->", 1)[0]
    assert table == decoding_options.markdown_table() + "\n"  # (the page joins its parts by newlines)
    details = page.split("## What each decoding option does\n", 1)[1]
    assert details.endswith(decoding_options.markdown_details())
    assert [line[len("### `"):-1] for line in details.splitlines() if line.startswith("### ")] == [
        row.name for row in OPTIONS]


def test_each_processor_row_names_the_processor_that_joins_the_step_when_it_is_on():
    """A row's `processor` is a class of `keras_transformer.decoding.processors` (exported by the
    package under its name) that `make_logits_processors` makes exactly when the option is on;
    `CONSTRAINTS` are those rows; the XLA search refuses the ones not marked `xla`, naming them."""
    import tensorflow as tf

    import keras_transformer.decoding as decoding
    from keras_transformer.constants import EOS_ID
    from keras_transformer.decoding import SearchOptions, make_logits_processors, processors
    from keras_transformer.inference.searcher import _xla_constraints

    rows = [row for row in OPTIONS if row.processor]
    assert decoding_options.CONSTRAINTS == tuple(row.name for row in rows)
    on = {"min_length": 2, "no_repeat_ngram_size": 2, "disallow_unk": True, "repetition_penalty": 1.5,
          "suppress_sequences": [[4, 5]]}
    assert sorted(on) == sorted(decoding_options.CONSTRAINTS)
    for row in rows:
        assert getattr(decoding, row.processor) is getattr(processors, row.processor)
        assert make_logits_processors(SearchOptions(**{row.name: row.default}), EOS_ID) == ()
        made = make_logits_processors(SearchOptions(**{row.name: on[row.name]}), EOS_ID)
        assert [type(processor).__name__ for processor in made] == [row.processor]
        if row.xla:
            assert _xla_constraints(SearchOptions(**{row.name: on[row.name]}))[row.name] == on[row.name]
        else:
            with pytest.raises(ValueError, match=rf"^{row.name} runs in the plain graph \(xla=False\)$"):
                _xla_constraints(SearchOptions(**{row.name: on[row.name]}))
    with pytest.raises(ValueError, match="^the XLA search takes min_length, no_repeat_ngram_size and disallow_unk as "
                                         "python values"):
        _xla_constraints(SearchOptions(min_length=tf.constant(2)))  # (a run-time value: the plain graph's)
