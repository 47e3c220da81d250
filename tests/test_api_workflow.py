"""docs/api.md "From text to a served model with your own `fit`", run as written.

The section's two Python blocks (Sybil skips them: they train and export) run here, in
order, in a directory holding `data/`, a toy corpus this test writes. Then the objects
they made are checked against second computations: the batches against the teacher-forcing
convention the page states and the corpus's pairs, `evaluate`'s accuracy against the
model's own predictions, the SavedModel's translations against the in-process
`Translator`'s, CTranslate2's tokenization and greedy ids against ours.
"""

import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf
from helpers import write_corpus

from keras_transformer import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.decoding import SearchOptions
from keras_transformer.inference.translator import Translator

API_PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md"
SECTION = "## From text to a served model with your own `fit`"

pytestmark = pytest.mark.slow


def documented_blocks():
    """The section's ```python blocks, in page order."""
    text = API_PAGE.read_text(encoding="utf-8")
    section = text[text.index(SECTION):]
    section = section[:section.find("\n## ", len(SECTION))] if "\n## " in section[len(SECTION):] else section
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    """The documented code's namespace after both blocks ran, in a directory with `data/`
    (the working directory while this module's tests run)."""
    pytest.importorskip("ctranslate2")
    directory = tmp_path_factory.mktemp("api")
    write_corpus(directory / "data", pairs=600, valid=20, seed=0)
    blocks = documented_blocks()
    assert len(blocks) == 2, f"expected the data-to-export block and the CTranslate2 block, got {len(blocks)}"
    namespace = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(directory)  # for the tests too: the corpus's datasets read `data/...`
        for block in blocks:
            exec(compile(block, str(API_PAGE), "exec"), namespace)  # noqa: S102  (the page's own code)
        yield namespace


def rows(batch):
    """A batch tensor as lists of ids without the PAD_ID padding after the end."""
    out = []
    for row in batch.numpy().tolist():
        while row and row[-1] == PAD_ID:
            row.pop()
        out.append(row)
    return out


def test_the_batches_are_teacher_forcing_pairs_of_the_corpus(workflow):
    ns = workflow
    tokenizer = ns["tokenizer"]
    train_pairs = {(s.decode(), t.decode()) for s, t in ns["corpus"].splits["train"].as_numpy_iterator()}
    sources, targets_in, targets_out = rows(ns["source"]), rows(ns["target_in"]), rows(ns["target_out"])
    assert len(sources) > 1
    for source, target_in, target_out in zip(sources, targets_in, targets_out):
        assert source[-1] == EOS_ID and EOS_ID not in source[:-1]
        assert target_in[0] == BOS_ID and BOS_ID not in target_in[1:]
        assert target_out[-1] == EOS_ID and EOS_ID not in target_out[:-1]
        assert target_in[1:] == target_out[:-1]  # the same pieces, shifted by one
        text = (tokenizer.detokenize(tf.constant(source[:-1])).numpy().decode(),
                tokenizer.detokenize(tf.constant(target_out[:-1])).numpy().decode())
        assert text in train_pairs


def test_evaluate_reports_the_models_own_token_accuracy(workflow):
    ns = workflow
    model, hits, count = ns["model"], 0, 0
    for (source, target_in), target_out in ns["valid"]:
        predicted = np.argmax(model((source, target_in), training=False), axis=-1)  # [batch, T]
        real = target_out.numpy() != PAD_ID
        hits += int(np.sum((predicted == target_out.numpy()) & real))
        count += int(np.sum(real))
    assert count > 0
    np.testing.assert_allclose(ns["accuracy"], hits / count, rtol=1e-6)
    assert np.isfinite(ns["loss"]) and ns["loss"] > 0


def test_the_savedmodel_translates_as_the_in_process_translator(workflow):
    ns = workflow
    assert len(ns["sources"]) == 4
    translator = Translator(ns["model"], ns["config"], ns["tokenizer"].model_bytes)
    assert ns["translations"] == translator.translate(ns["sources"])
    assert ns["path"].name == "1" and (ns["path"] / "saved_model.pb").is_file()


def test_ctranslate2_tokenizes_and_greedy_decodes_as_we_do(workflow):
    ns = workflow
    config, sp = ns["config"], ns["sp"]
    translator = Translator(ns["model"], config, ns["tokenizer"].model_bytes)
    ids, lengths = translator.encode_text(tf.constant(ns["sources"]))
    ours_pieces = [[sp.id_to_piece(int(i)) for i in row[:n]] for row, n in zip(ids.numpy(), lengths.numpy())]
    assert ns["pieces"] == ours_pieces  # the page's SentencePiece pieces are our source ids
    options = SearchOptions(beam_size=1, alpha=config.length_penalty_alpha, num_results=1,
                            extra_length=config.decode_extra_length)
    search = tf.function(lambda ids, lengths: translator.searcher.search(ids, lengths, options), autograph=False)
    best, _ = search(ids, lengths)
    ours = []
    for row in best.numpy()[:, 0].tolist():
        ours.append(row[:row.index(EOS_ID) + 1] if EOS_ID in row else [i for i in row if i != PAD_ID])
    theirs = []
    for pieces in ns["pieces"]:
        greedy = translation_options_greedy(ns, len(pieces))
        result = ns["ct2"].translate_batch([pieces], **greedy, return_end_token=True)[0]
        theirs.append([sp.piece_to_id(p) for p in result.hypotheses[0]])
    assert theirs == ours
    assert len(ns["ct2_translations"]) == len(ns["sources"])


def translation_options_greedy(ns, source_length):
    """The page's `translation_options` for one source, with beam 1."""
    from export.ctranslate2 import translation_options  # noqa: PLC0415  (the ctranslate2 extra)

    return translation_options(ns["config"], source_length, beam_size=1)
