"""Gold syntactic annotations of the embedded corpus's English side: texts equal
the corpus, every tree is well formed and consistent, hand-checked gold for
each sentence kind, and the CoNLL-U directory round trip."""

import pytest

from keras_transformer.data import embedded as E
from keras_transformer.data.embedded import (NP, Clause, annotate, embedded_annotations, embedded_corpus,
                                             write_embedded_conllu)
from keras_transformer.data.syntax import AnnotatedSentence, Tree, dependency_distances, parse_bracketed, read_conllu

UD_UPOS = {"ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
           "SCONJ", "SYM", "VERB", "X"}
UD_RELATIONS = {"acl", "advcl", "advmod", "amod", "appos", "aux", "case", "cc", "ccomp", "clf", "compound", "conj",
                "cop", "csubj", "dep", "det", "discourse", "dislocated", "expl", "fixed", "flat", "goeswith", "iobj",
                "list", "mark", "nmod", "nsubj", "nummod", "obj", "obl", "orphan", "parataxis", "punct",
                "reparandum", "root", "vocative", "xcomp"}
PENN_PHRASES = {"S", "SBAR", "SQ", "NP", "VP", "PP", "ADVP", "PRT"}
SPLITS = ("train", "valid", "test")


@pytest.fixture(scope="module")
def corpus():
    return embedded_corpus(0)


@pytest.fixture(scope="module")
def annotations():
    return embedded_annotations(0)


def joined(words):
    """Words -> text: a space between words, none before , . ?"""
    return "".join(w if i == 0 or w in ",.?" else " " + w for i, w in enumerate(words))


# ---------------------------------------------------------------- corpus level

def test_texts_are_the_corpus_english_side(corpus, annotations):
    assert set(annotations) == set(SPLITS)
    for split in SPLITS:
        assert [a.text for a in annotations[split]] == [en for en, _ in corpus[split]], split
        assert [a.sent_id for a in annotations[split]] == [f"{split}-{i}" for i in range(len(corpus[split]))]
        assert all(isinstance(a, AnnotatedSentence) for a in annotations[split])
    # another seed: a 2,000-sentence train prefix (the same stream as the full corpus, see test_embedded.py)
    other = embedded_annotations(1, train_size=2000)
    train, valid, test = E._generate(1, 2000)
    for split, pairs in zip(SPLITS, (train, valid, test)):
        assert [a.text for a in other[split]] == [en for en, _ in pairs], split
    assert [a.text for a in other["train"][:50]] != [a.text for a in annotations["train"][:50]]


def test_corpus_unchanged_by_the_structure_recording():
    """`_generate` and `_generate_records` with a `keep` (what the annotations use) select the same pairs."""
    records = E._generate_records(3, 300, keep=lambda split, index, en, de, structure: (en, de, structure))
    assert tuple(tuple((en, de) for en, de, _ in split) for split in records) == E._generate.__wrapped__(3, 300)
    (en, de, (kind, args)) = records[0][0]
    assert E._BUILDERS[kind](*args) == (en, de)


def _constituents(tree, start=0):
    """(label, [first, end) word span) of every constituent."""
    spans, position = [], start
    for child in tree.children:
        if isinstance(child, Tree):
            inner = _constituents(child, position)
            spans += inner
            position = inner[-1][1][1]
        else:
            position += 1
    return spans + [(tree.label, (start, position))]


def _check(a):
    n = len(a.words)
    assert len(a.upos) == len(a.deprel) == len(a.heads) == n, a.text
    assert joined(a.words) == a.text, a.text
    assert set(a.upos) <= UD_UPOS, a.upos
    assert {d.split(":")[0] for d in a.deprel} <= UD_RELATIONS, a.deprel
    # a tree: one root, every word leads to it
    roots = [i for i, h in enumerate(a.heads) if h == -1]
    assert len(roots) == 1 and a.deprel[roots[0]] == "root", a.text
    assert all(d == "root" or 0 <= h < n for d, h in zip(a.deprel, a.heads))
    for i in range(n):
        j, steps = i, 0
        while a.heads[j] != -1:
            j, steps = a.heads[j], steps + 1
            assert steps <= n, f"cycle in {a.text}"
    # projective: every word between a word and its head is dominated by the head
    for i, h in enumerate(a.heads):
        for k in range(min(i, h) + 1, max(i, h)):
            j = k
            while j not in (-1, h):
                j = a.heads[j]
            assert j == h, f"arc {i}->{h} is not projective in {a.text}"
    assert a.upos[-1] == "PUNCT" and a.deprel[-1] == "punct" and a.heads[-1] == roots[0]
    # the constituency tree: leaves are the words, Penn phrase labels, and every
    # constituent is a dependency subtree (exactly one word with its head outside)
    tree = parse_bracketed(a.tree)
    assert tree.leaves() == list(a.words), a.text
    assert tree.label == ("SQ" if a.text.endswith("?") else "S")
    for label, (first, end) in _constituents(tree):
        assert label in PENN_PHRASES, label
        outside = [i for i in range(first, end) if not first <= a.heads[i] < end]
        assert len(outside) == 1, (label, a.words[first:end], a.text)


def test_every_sentence_is_well_formed(annotations):
    for split in SPLITS:
        for a in annotations[split]:
            _check(a)
    for a in annotations["valid"] + annotations["test"]:  # the NumPy check too (slower: a subset)
        dependency_distances(a.heads)


def test_every_adverbial_and_place_has_tags():
    for phrase in list(E.PLACES) + [a for table in E.TIME_ADVERBS.values() for a in table]:
        a = annotate("simple", Clause("I", "see", NP("dog")), phrase if phrase in E._ADVERB_DE else None)
        _check(a)
        if phrase in E.PLACES:
            _check(annotate("question", Clause("we", "find", NP("key"), place=phrase)))


# ---------------------------------------------------------------- hand-checked gold

def gold(rows):
    """'word UPOS head deprel' rows (head: 0-based index, -1 for the root) -> words, upos, heads, deprels."""
    words, upos, heads, deprel = zip(*(row.split() for row in rows))
    return words, upos, tuple(int(h) for h in heads), deprel


CASES = [
    ("simple", (Clause(NP("man"), "see", NP("dog")), "today"),
     "Today the man sees the dog.",
     ["Today ADV 3 advmod", "the DET 2 det", "man NOUN 3 nsubj", "sees VERB -1 root", "the DET 5 det",
      "dog NOUN 3 obj", ". PUNCT 3 punct"],
     "(S (ADVP Today ) (NP the man ) (VP sees (NP the dog ) ) . )"),
    # do-support question, separable-verb particle, an adjective
    ("question", (Clause("she", "pick up", NP("ball", "a", adj="red"), "past"),),
     "Did she pick up a red ball?",
     ["Did AUX 2 aux", "she PRON 2 nsubj", "pick VERB -1 root", "up ADP 2 compound:prt", "a DET 6 det",
      "red ADJ 6 amod", "ball NOUN 2 obj", "? PUNCT 2 punct"],
     "(SQ Did (NP she ) (VP pick (PRT up ) (NP a red ball ) ) ? )"),
    # fronted subordinate clause, possessive, compound noun, negated future, demonstrative plural
    ("fronted_subordinate",
     ("if", Clause(NP("child", "my"), "open", NP("kitchen door")),
      Clause(NP("mother", plural=True), "close", NP("window", "this", plural=True), "future", negated=True)),
     "If my child opens the kitchen door, the mothers will not close these windows.",
     ["If SCONJ 3 mark", "my PRON 2 nmod:poss", "child NOUN 3 nsubj", "opens VERB 12 advcl", "the DET 6 det",
      "kitchen NOUN 6 compound", "door NOUN 3 obj", ", PUNCT 12 punct", "the DET 9 det", "mothers NOUN 12 nsubj",
      "will AUX 12 aux", "not PART 12 advmod", "close VERB -1 root", "these DET 14 det", "windows NOUN 12 obj",
      ". PUNCT 12 punct"],
     "(S (SBAR If (S (NP my child ) (VP opens (NP the kitchen door ) ) ) ) , (NP the mothers ) "
     "(VP will not (VP close (NP these windows ) ) ) . )"),
    # reported "that" clause, perfect, "an", a place
    ("reported", ("he", "say", Clause(NP("teacher", "a"), "read", NP("book", "a", adj="old"), "perfect",
                                      place="in the garden")),
     "He says that a teacher has read an old book in the garden.",
     ["He PRON 1 nsubj", "says VERB -1 root", "that SCONJ 6 mark", "a DET 4 det", "teacher NOUN 6 nsubj",
      "has AUX 6 aux", "read VERB 1 ccomp", "an DET 9 det", "old ADJ 9 amod", "book NOUN 6 obj",
      "in ADP 12 case", "the DET 12 det", "garden NOUN 6 obl", ". PUNCT 1 punct"],
     "(S (NP He ) (VP says (SBAR that (S (NP a teacher ) (VP has (VP read (NP an old book ) "
     "(PP in (NP the garden ) ) ) ) ) ) ) . )"),
    # adverbial clause after the main clause; "look for": a prepositional object (obl + case)
    ("with_subordinate", (Clause("I", "look for", NP("key", "my", plural=True)), "because",
                          Clause(NP("cat"), "eat", NP("cake", "a"), "past")),
     "I look for my keys because the cat ate a cake.",
     ["I PRON 1 nsubj", "look VERB -1 root", "for ADP 4 case", "my PRON 4 nmod:poss", "keys NOUN 1 obl",
      "because SCONJ 8 mark", "the DET 7 det", "cat NOUN 8 nsubj", "ate VERB 1 advcl", "a DET 10 det",
      "cake NOUN 8 obj", ". PUNCT 1 punct"],
     "(S (NP I ) (VP look (PP for (NP my keys ) ) (SBAR because (S (NP the cat ) (VP ate (NP a cake ) ) ) ) ) . )"),
    # a noun-phrase time adverbial, a bare plural compound
    ("simple", (Clause(NP("girl", plural=True), "buy", NP("apple tree", "a", plural=True), "past"), "last week"),
     "Last week the girls bought apple trees.",
     ["Last ADJ 1 amod", "week NOUN 4 obl:tmod", "the DET 3 det", "girls NOUN 4 nsubj", "bought VERB -1 root",
      "apple NOUN 6 compound", "trees NOUN 4 obj", ". PUNCT 4 punct"],
     "(S (NP Last week ) (NP the girls ) (VP bought (NP apple trees ) ) . )"),
    # a prepositional time adverbial, a place without an article, the particle "away" (ADV)
    ("simple", (Clause(NP("woman"), "throw away", NP("egg", "this"), place="at home"), "in the morning"),
     "In the morning the woman throws away this egg at home.",
     ["In ADP 2 case", "the DET 2 det", "morning NOUN 5 obl", "the DET 4 det", "woman NOUN 5 nsubj",
      "throws VERB -1 root", "away ADV 5 compound:prt", "this DET 8 det", "egg NOUN 5 obj", "at ADP 10 case",
      "home NOUN 5 obl", ". PUNCT 5 punct"],
     "(S (PP In (NP the morning ) ) (NP the woman ) (VP throws (PRT away ) (NP this egg ) (PP at (NP home ) ) ) . )"),
]


@pytest.mark.parametrize("kind, args, text, rows, tree", CASES, ids=[c[2] for c in CASES])
def test_hand_checked_gold(kind, args, text, rows, tree):
    a = annotate(kind, *args, sent_id="x-1")
    assert E._BUILDERS[kind](*args)[0] == text  # the sentence the corpus builder makes
    words, upos, heads, deprel = gold(rows)
    assert a == AnnotatedSentence(words=words, upos=upos, deprel=deprel, heads=heads, text=text, sent_id="x-1",
                                  tree=tree)
    _check(a)
    dependency_distances(a.heads)


# ---------------------------------------------------------------- CoNLL-U directory

def test_write_embedded_conllu_round_trip(tmp_path, corpus, annotations):
    limit = 120
    paths = write_embedded_conllu(tmp_path, seed=0, limit=limit)
    assert sorted(p.name for p in paths) == sorted(
        f"{split}.{suffix}" for split in SPLITS for suffix in ("en.conllu", "de"))
    for split in SPLITS:
        conllu = tmp_path / f"{split}.en.conllu"
        text = conllu.read_text(encoding="utf-8")
        assert text.endswith("\n\n") and not text.endswith("\n\n\n")
        assert read_conllu(conllu) == annotations[split][:limit]
        german = (tmp_path / f"{split}.de").read_text(encoding="utf-8")
        assert german.endswith("\n") and german.split("\n")[:-1] == [de for _, de in corpus[split][:limit]]
