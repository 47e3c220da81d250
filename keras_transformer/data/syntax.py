"""Syntax for the syntax-aware models (the survey's section 3): reading annotated
sources, tree distances, the 0-1 and soft attention masks, tree linearisation.

Everything here is plain Python/NumPy, computed once per sentence in the input
pipeline:

* `read_conllu(path)`: CoNLL-U as users have it (the `conllu` package):
  comments, multiword token ranges (`3-4`, skipped: their words follow),
  empty nodes (`8.1`, skipped), enhanced dependencies (ignored). Per word:
  form, UPOS, dependency label and head (0-based, -1 for the root).
* `dependency_distances(heads)`: `omega(i, j)`, the number of edges between
  words `i` and `j` in the dependency tree.
* `parse_bracketed` / `linearise`: a constituency tree as a bracketed
  sequence `(S (NP the dog ) (VP barks ) )` and back (tree linearisation,
  section 3.1); `leaf_distances(tree)`: `omega` between its words.
* `piece_distances`, `piece_tags`: word-level distances and tags mapped to
  subword pieces (a word's pieces inherit its tags; pieces of one word are at
  distance 0 from each other and at their word's distance from the others).
* `hard_mask(omega, max_distance)` (0-1 masking: `omega <= max_distance`) and
  `soft_mask(omega, variant)` (`DNorm`: `"zscore"`, the standardised score of
  `-omega` over `j`; or `"inverse"`, `1 / (1 + omega)` normalised to sum 1
  over `j`).

These are the references: the pipeline and the served model compute the
same features with graph ops (`keras_transformer.data.annotated`), the model
consumes them in `TagFactorEmbedding` and `SyntaxAttentionMatrix`, and the
tests compare the two.
"""

from __future__ import annotations

import collections
import dataclasses
import os

import numpy as np


class AnnotationError(ValueError):
    """Malformed annotation (a tree that is not a tree, unbalanced brackets)."""


@dataclasses.dataclass(frozen=True)
class AnnotatedSentence:
    """One sentence's words with their tags and dependency tree.

    `heads[i]` is the 0-based index of word `i`'s head, -1 for the root.
    `tree` is the sentence's constituency tree, bracketed (`parse_bracketed`'s
    format, its leaves the words), where one is known ("" otherwise).
    """

    words: tuple[str, ...]
    upos: tuple[str, ...]
    deprel: tuple[str, ...]
    heads: tuple[int, ...]
    text: str = ""
    sent_id: str = ""
    tree: str = ""


def read_conllu(path: str | os.PathLike) -> list[AnnotatedSentence]:
    """Reads a CoNLL-U file; raises `AnnotationError` naming the file and sentence on a bad tree."""
    import conllu

    with open(path, encoding="utf-8-sig") as f:  # -sig: less a byte order mark, if the file starts with one
        sentences = conllu.parse(f.read())
    out = []
    for number, sentence in enumerate(sentences, 1):
        tokens = [t for t in sentence if isinstance(t["id"], int)]  # no ranges (3-4), no empty nodes (8.1)
        index = {t["id"]: i for i, t in enumerate(tokens)}
        heads = []
        for token in tokens:
            head = token["head"]
            if head is None or (head != 0 and head not in index):
                raise AnnotationError(f"{path}: sentence {number} ({sentence.metadata.get('sent_id', '?')}): "
                                   f"word {token['id']} {token['form']!r} has head {head!r}, not a word")
            heads.append(-1 if head == 0 else index[head])
        try:
            dependency_distances(heads)
        except AnnotationError as error:
            raise AnnotationError(f"{path}: sentence {number} ({sentence.metadata.get('sent_id', '?')}): "
                               f"{error}") from None
        out.append(AnnotatedSentence(
            words=tuple(t["form"] for t in tokens), upos=tuple(t["upos"] or "_" for t in tokens),
            deprel=tuple(t["deprel"] or "_" for t in tokens), heads=tuple(heads),
            text=sentence.metadata.get("text", ""), sent_id=sentence.metadata.get("sent_id", ""),
            tree=sentence.metadata.get("tree", "")))
    return out


def to_conllu(sentence: AnnotatedSentence) -> str:
    """One sentence as a CoNLL-U block (10 tab-separated columns per word, a
    `# text` comment, and `# tree` when a constituency tree is known); no
    trailing blank line. `read_conllu` reads it back."""
    lines = []
    if sentence.sent_id:
        lines.append(f"# sent_id = {sentence.sent_id}")
    lines.append(f"# text = {sentence.text or ' '.join(sentence.words)}")
    if sentence.tree:
        lines.append(f"# tree = {sentence.tree}")
    for i, (word, upos, deprel, head) in enumerate(
            zip(sentence.words, sentence.upos, sentence.deprel, sentence.heads), 1):
        lines.append("\t".join([str(i), word, "_", upos, "_", "_", str(head + 1), deprel, "_", "_"]))
    return "\n".join(lines)


def _distances_in_tree(nodes: int, edges: list[tuple[int, int]], leaves: list[int]) -> np.ndarray:
    """Edge counts between `leaves` in an undirected tree of `nodes` nodes (BFS from each leaf)."""
    neighbours = [[] for _ in range(nodes)]
    for a, b in edges:
        neighbours[a].append(b)
        neighbours[b].append(a)
    out = np.zeros((len(leaves), len(leaves)), np.int32)
    for row, start in enumerate(leaves):
        seen = np.full(nodes, -1, np.int64)
        seen[start] = 0
        queue = collections.deque([start])
        while queue:
            node = queue.popleft()
            for other in neighbours[node]:
                if seen[other] < 0:
                    seen[other] = seen[node] + 1
                    queue.append(other)
        if (seen[leaves] < 0).any():
            raise AnnotationError("the tree is not connected")
        out[row] = seen[leaves]
    return out


def dependency_distances(heads) -> np.ndarray:
    """`omega[i, j]`: edges between words `i` and `j` of a dependency tree.

    Args:
        heads: per word, the 0-based index of its head, -1 for the root.

    Returns:
        int32 `[n, n]`, symmetric, 0 on the diagonal.

    Raises:
        AnnotationError: not exactly one root, or a cycle.
    """
    heads = list(heads)
    n = len(heads)
    if n == 0:
        return np.zeros((0, 0), np.int32)
    if sum(h == -1 for h in heads) != 1:
        raise AnnotationError(f"a dependency tree needs exactly one root, got {sum(h == -1 for h in heads)}")
    if any(not -1 <= h < n or h == i for i, h in enumerate(heads)):
        raise AnnotationError(f"heads out of range or pointing to themselves: {heads}")
    edges = [(i, h) for i, h in enumerate(heads) if h >= 0]
    return _distances_in_tree(n, edges, list(range(n)))


@dataclasses.dataclass
class Tree:
    """A constituency tree: a label and children (subtrees or words)."""

    label: str
    children: list  # of Tree or str

    def leaves(self) -> list[str]:
        return [w for c in self.children for w in (c.leaves() if isinstance(c, Tree) else [c])]


def parse_bracketed(text: str | list[str]) -> Tree:
    """`"(S (NP the dog ) (VP barks ) )"` (or its tokens) -> `Tree`.

    Tokens are separated by spaces; `(LABEL` opens a constituent, `)` closes one.
    """
    tokens = text.split() if isinstance(text, str) else list(text)
    stack: list[Tree] = []
    root = None
    for position, token in enumerate(tokens):
        if token.startswith("(") and len(token) > 1:
            node = Tree(token[1:], [])
            if stack:
                stack[-1].children.append(node)
            elif root is not None:
                raise AnnotationError(f"a second tree starts at token {position}: {token!r}")
            else:
                root = node
            stack.append(node)
        elif token == ")":
            if not stack:
                raise AnnotationError(f"unbalanced ')' at token {position}")
            stack.pop()
        else:
            if not stack:
                raise AnnotationError(f"word {token!r} outside any constituent at token {position}")
            stack[-1].children.append(token)
    if stack or root is None:
        raise AnnotationError(f"unbalanced brackets: {len(stack)} constituent(s) left open" if root
                           else "no tree")
    return root


def linearise(tree: Tree) -> list[str]:
    """`Tree` -> tokens `["(S", "(NP", "the", "dog", ")", ...]` (`parse_bracketed`'s inverse)."""
    out = [f"({tree.label}"]
    for child in tree.children:
        out.extend(linearise(child) if isinstance(child, Tree) else [child])
    out.append(")")
    return out


def leaf_distances(tree: Tree) -> np.ndarray:
    """`omega[i, j]`: edges between words `i` and `j` (leaves) of a constituency tree.

    A word is a node below its constituent, so two words of one constituent are
    2 edges apart.
    """
    edges, leaves = [], []

    def visit(node, parent):
        index = len(nodes)
        nodes.append(node)
        if parent is not None:
            edges.append((parent, index))
        if isinstance(node, Tree):
            for child in node.children:
                visit(child, index)
        else:
            leaves.append(index)

    nodes: list = []
    visit(tree, None)
    return _distances_in_tree(len(nodes), edges, leaves)


def piece_distances(omega: np.ndarray, pieces_per_word) -> np.ndarray:
    """Word distances -> piece distances: piece `p` of word `w(p)`: `omega[w(p), w(q)]`
    (0 between pieces of one word)."""
    word_of_piece = np.repeat(np.arange(len(pieces_per_word)), pieces_per_word)
    return omega[np.ix_(word_of_piece, word_of_piece)]


def piece_tags(tags, pieces_per_word) -> list:
    """A word's tag for each of its pieces."""
    return [tag for tag, count in zip(tags, pieces_per_word) for _ in range(count)]


def hard_mask(omega: np.ndarray, max_distance: int) -> np.ndarray:
    """0-1 masking: True where `omega <= max_distance` (attention allowed)."""
    return np.asarray(omega) <= max_distance


def soft_mask(omega: np.ndarray, variant: str = "zscore") -> np.ndarray:
    """`DNorm(omega)`, per row `i` over `j`.

    `"zscore"`: `(-omega - mean_j(-omega)) / std_j(-omega)` (0 where the row is
    constant); `"inverse"`: `(1 / (1 + omega)) / sum_j (1 / (1 + omega))`.
    """
    omega = np.asarray(omega, np.float32)
    if variant == "zscore":
        score = -omega
        mean = score.mean(axis=-1, keepdims=True)
        std = score.std(axis=-1, keepdims=True)
        return np.where(std > 0, (score - mean) / np.where(std > 0, std, 1.0), 0.0).astype(np.float32)
    if variant == "inverse":
        inverse = 1.0 / (1.0 + omega)
        return (inverse / inverse.sum(axis=-1, keepdims=True)).astype(np.float32)
    raise ValueError(f"soft_mask variant must be 'zscore' or 'inverse', got {variant!r}")
