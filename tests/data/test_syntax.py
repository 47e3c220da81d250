"""Syntax annotations: CoNLL-U reading, tree distances against hand-computed trees,
masks against NumPy, subword mapping, tree linearisation round trip."""

import pathlib

import numpy as np
import pytest

from keras_transformer.data.syntax import (AnnotationError, dependency_distances, hard_mask, leaf_distances,
                                           linearise, parse_bracketed, piece_distances, piece_tags,
                                           read_conllu, soft_mask)

PUD = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "pud"

# "the big dog barks loudly": det(dog, the), amod(dog, big), nsubj(barks, dog),
# root(barks), advmod(barks, loudly)
HEADS = [2, 2, 3, -1, 3]
# Edges: the-dog, big-dog, dog-barks, loudly-barks.
OMEGA = np.array([[0, 2, 1, 2, 3],
                  [2, 0, 1, 2, 3],
                  [1, 1, 0, 1, 2],
                  [2, 2, 1, 0, 1],
                  [3, 3, 2, 1, 0]])

CONLLU = """# sent_id = s1
# text = the big dog barks loudly
1\tthe\tthe\tDET\tDT\t_\t3\tdet\t_\t_
2\tbig\tbig\tADJ\tJJ\t_\t3\tamod\t_\t_
3\tdog\tdog\tNOUN\tNN\t_\t4\tnsubj\t_\t_
4\tbarks\tbark\tVERB\tVBZ\t_\t0\troot\t_\t_
5\tloudly\tloudly\tADV\tRB\t_\t4\tadvmod\t_\tSpaceAfter=No

# sent_id = s2
# text = I'm here
1-2\tI'm\t_\t_\t_\t_\t_\t_\t_\t_
1\tI\tI\tPRON\tPRP\t_\t3\tnsubj\t3:nsubj\t_
2\t'm\tbe\tAUX\tVBP\t_\t3\tcop\t3:cop\t_
3\there\there\tADV\tRB\t_\t0\troot\t0:root\t_
3.1\tthere\tthere\tADV\tRB\t_\t_\t_\t3:conj\t_

"""


def test_dependency_distances_of_a_hand_computed_tree():
    np.testing.assert_array_equal(dependency_distances(HEADS), OMEGA)
    with pytest.raises(AnnotationError, match="exactly one root, got 2"):
        dependency_distances([-1, -1])
    with pytest.raises(AnnotationError, match="not connected"):
        dependency_distances([-1, 2, 1])  # words 1 and 2 head each other: a cycle apart from the root


def test_constituency_leaf_distances_and_linearisation_round_trip():
    text = "(S (NP the big dog ) (VP barks (ADVP loudly ) ) )"
    tree = parse_bracketed(text)
    assert tree.leaves() == ["the", "big", "dog", "barks", "loudly"]
    assert " ".join(linearise(tree)) == text
    assert linearise(parse_bracketed(linearise(tree))) == linearise(tree)
    # the-big: 2 (both under NP); the-barks: the-NP-S-VP-barks = 4; barks-loudly: barks-VP-ADVP-loudly = 3
    omega = leaf_distances(tree)
    assert omega[0, 1] == 2 and omega[0, 3] == 4 and omega[3, 4] == 3 and omega[0, 4] == 5
    np.testing.assert_array_equal(omega, omega.T)
    for bad, message in [("(S (NP a )", "left open"), ("(S a ) )", "unbalanced"), ("a (S b )", "outside")]:
        with pytest.raises(AnnotationError, match=message):
            parse_bracketed(bad)


def test_read_conllu_skips_ranges_and_empty_nodes(tmp_path):
    path = tmp_path / "x.conllu"
    path.write_text(CONLLU, encoding="utf-8")
    first, second = read_conllu(path)
    assert first.words == ("the", "big", "dog", "barks", "loudly") and first.heads == tuple(HEADS)
    assert first.upos[:2] == ("DET", "ADJ") and first.deprel[3] == "root" and first.sent_id == "s1"
    assert second.words == ("I", "'m", "here") and second.heads == (2, 2, -1)
    path.write_text(CONLLU.replace("3\tdog\tdog\tNOUN\tNN\t_\t4", "3\tdog\tdog\tNOUN\tNN\t_\t9"), encoding="utf-8")
    with pytest.raises(AnnotationError, match=r"x.conllu: sentence 1 \(s1\): word 3 'dog' has head 9"):
        read_conllu(path)
    path.write_text(CONLLU, encoding="utf-8-sig")  # a byte order mark first (Windows editors)
    assert read_conllu(path) == [first, second]


@pytest.mark.skipif(not PUD.is_dir(), reason="../shared/data/pud is absent")
def test_reads_the_pud_treebanks_as_they_are():
    english = read_conllu(PUD / "en_pud-ud-test.conllu")
    german = read_conllu(PUD / "de_pud-ud-test.conllu")
    assert len(english) == len(german) == 1000
    assert [s.sent_id for s in english] == [s.sent_id for s in german]
    texts = (PUD / "test.en").read_text(encoding="utf-8").splitlines()
    assert [s.text for s in english] == texts
    for sentence in english[:50]:
        omega = dependency_distances(sentence.heads)
        assert omega.shape == (len(sentence.words),) * 2 and omega.max() < len(sentence.words)


def test_masks_against_numpy():
    np.testing.assert_array_equal(hard_mask(OMEGA, 1), OMEGA <= 1)
    assert hard_mask(OMEGA, 1).sum() == 5 + 2 * 4  # the diagonal and the 4 edges, both ways
    zscore = soft_mask(OMEGA, "zscore")
    row = -OMEGA[0].astype(np.float64)
    np.testing.assert_allclose(zscore[0], (row - row.mean()) / row.std(), rtol=1e-6)
    inverse = soft_mask(OMEGA, "inverse")
    np.testing.assert_allclose(inverse.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(inverse[4], (1 / (1 + OMEGA[4])) / (1 / (1 + OMEGA[4])).sum(), rtol=1e-6)
    np.testing.assert_array_equal(soft_mask(np.zeros((1, 1)), "zscore"), [[0.0]])
    with pytest.raises(ValueError, match="'zscore' or 'inverse'"):
        soft_mask(OMEGA, "cosine")


def test_pieces_inherit_their_words_tags_and_distances():
    pieces = [1, 2, 1, 3, 1]  # "big" -> 2 pieces, "barks" -> 3
    omega = piece_distances(OMEGA, pieces)
    assert omega.shape == (8, 8)
    assert omega[1, 2] == 0  # two pieces of "big"
    assert omega[1, 0] == OMEGA[1, 0] == 2 and omega[2, 0] == 2
    assert omega[0, 7] == OMEGA[0, 4] == 3 and omega[4, 6] == 0
    assert piece_tags(["DET", "ADJ", "NOUN", "VERB", "ADV"], pieces) == [
        "DET", "ADJ", "ADJ", "NOUN", "VERB", "VERB", "VERB", "ADV"]
