"""BLEU as the Multi30k literature reports it: lowercased, Moses-tokenized, multi-bleu.perl.

    python -m benchmarks.literature_bleu HYPOTHESES REFERENCES [--lang de]

The project's figure is sacreBLEU on detokenized, cased text (its signature
printed beside it). The Multi30k papers that issue #17 compares with (Wu et
al., ACL 2021; the WMT 2018 multimodal task's text-only systems) score
**lowercased tokenized** text: the Multi30k distribution's `*.lc.norm.tok.*`
files are made by Moses' `lowercase.perl`, `normalize-punctuation.perl -l
LANG` and `tokenizer.perl -l LANG` (no `-a`), and `multi-bleu.perl` scores
the systems' output of the same pipeline. This module runs that pipeline
with `sacremoses` (the Python port of those Moses scripts) on both sides
and scores the tokens as they are (`sacrebleu` with `tokenize="none"` and
no smoothing: multi-bleu.perl's corpus BLEU), so our figure can be put
beside theirs on one metric. Which exact script each paper used is not
always stated; this is the conventional one.

It prints the three figures, each with its signature where sacreBLEU has
one; the last line is `lc_tok_bleu: X`.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import harness


# What a command says when the Moses pipeline is wanted and `sacremoses` is missing.
MOSES_MISSING = ("the literature's lowercased Moses-tokenized text needs sacremoses (the Moses scripts' "
                 "Python port), which is not installed: python -m pip install -e \".[bench]\"")


def have_moses() -> bool:
    """Whether `sacremoses` imports (it is in the `bench` and `dev` extras, not a dependency)."""
    try:
        import sacremoses  # noqa: F401
    except ImportError:
        return False
    return True


def moses_lc_tok(lines, lang):
    """Each line lowercased, punctuation-normalized and Moses-tokenized (`-l lang`, escaped
    as `tokenizer.perl` writes by default): the Multi30k `*.lc.norm.tok.*` pipeline."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), return_str=True, escape=True) for line in lines]


def lc_tok_bleu(hypotheses, references, lang="de", tokenized=False):
    """multi-bleu.perl's corpus BLEU of the two after `moses_lc_tok`: a `sacrebleu.BLEUScore`.
    `tokenized`: both are already in that form (a model trained on the literature's text,
    `benchmarks.multi30k_lc_tok`) and are scored as they are: the pipeline is not idempotent
    (a second pass escapes the first's `&quot;` again)."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references: the files must be "
                         f"line-aligned")
    metric = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    if tokenized:
        return metric.corpus_score(list(hypotheses), [list(references)])
    return metric.corpus_score(moses_lc_tok(hypotheses, lang), [moses_lc_tok(references, lang)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("hypotheses", help="detokenized translations, one per line")
    parser.add_argument("references", help="the references, line-aligned with them")
    parser.add_argument("--lang", default="de", help="target language for the Moses scripts (default de)")
    parser.add_argument("--tokenized", action="store_true",
                        help="both files are already lowercased and Moses-tokenized (a model trained on "
                             "benchmarks.multi30k_lc_tok's text): score them as they are")
    args = parser.parse_args(argv)
    if not args.tokenized and not have_moses():
        sys.exit(f"literature_bleu: {MOSES_MISSING}")
    import sacrebleu

    hypotheses, references = (harness.read_lines(p) for p in (args.hypotheses, args.references))
    if len(hypotheses) != len(references):
        parser.error(f"{args.hypotheses} has {len(hypotheses)} lines, {args.references} {len(references)}: "
                     f"the files must be line-aligned")
    for name, metric in (("cased", sacrebleu.metrics.BLEU()), ("lowercased", sacrebleu.metrics.BLEU(lowercase=True))):
        print(f"# {name} sacreBLEU {metric.corpus_score(hypotheses, [references]).score:.2f} "
              f"[{metric.get_signature()}]")
    score = lc_tok_bleu(hypotheses, references, args.lang, tokenized=args.tokenized)
    print(f"# lowercased Moses-tokenized BLEU (multi-bleu.perl) {score.score:.2f}")
    print(f"lc_tok_bleu: {score.score:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
