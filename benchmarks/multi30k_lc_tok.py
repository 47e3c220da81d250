"""Multi30k in the form the literature trains on: lowercased, punctuation-normalized, Moses-tokenized.

    python -m benchmarks.multi30k_lc_tok --data ../shared/data/multi30k --output runs/multi30k-lc-tok

Wu et al. (ACL 2021; the 41.02 that issue #93 compares with) train fairseq on the Multi30k
distribution's `*.lc.norm.tok.*` text (then a joint BPE): lowercase, punctuation normalized,
tokenized by Moses' `tokenizer.perl` with its XML escapes (`&quot;`, `&apos;`), and score the
output as it is against references of that form. The project trains on the raw cased text
(what a user translates) and lowercases and tokenizes only to score. This writes the
literature's form of every `SPLIT.en` / `SPLIT.de` file in `--data` (`benchmarks.literature_bleu`'s
`moses_lc_tok`, the `sacremoses` port of those scripts) to `--output`, so that the recipe can be
trained on the literature's own text:

    python train.py --config multi30k-literature --data runs/multi30k-lc-tok --model-dir RUN
    python -m benchmarks.multi30k --model-dir RUN --config multi30k-literature \\
        --data runs/multi30k-lc-tok --tokenized

(`--tokenized`: the output is already in the literature's form, scored as it is.) On the shared
Multi30k this reproduces the text of Wu et al.'s repository (their BPE joins removed) on 28,993
of 29,000 training pairs' German side, every valid English line, 1,013 of 1,014 valid German
lines and all 1,000 test2016 lines (the rest differ in where a quote mark falls against a full
stop). The data is read at run time and never copied into the repository.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from benchmarks import harness
from benchmarks.literature_bleu import MOSES_MISSING, have_moses, moses_lc_tok

LANGUAGES = ("en", "de")


def write_lc_tok(data, output) -> list[pathlib.Path]:
    """Every `SPLIT.en` / `SPLIT.de` pair of `data` in the literature's form (`moses_lc_tok`,
    line for line) under the same name in `output`; the files written, sorted."""
    data, output = pathlib.Path(data), pathlib.Path(output)
    stems = sorted(path.stem for path in data.glob("*.en") if (data / f"{path.stem}.de").exists())
    if not stems:
        raise FileNotFoundError(f"{data} has no SPLIT.en / SPLIT.de pair of files")
    output.mkdir(parents=True, exist_ok=True)
    written = []
    for stem in stems:
        for lang in LANGUAGES:
            lines = harness.read_lines(data / f"{stem}.{lang}")  # (not splitlines: U+2028 would split a line)
            path = output / f"{stem}.{lang}"
            path.write_text("".join(line + "\n" for line in moses_lc_tok(lines, lang)), encoding="utf-8")
            written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(harness.SHARED_DATA / "multi30k"),
                        help="a directory of SPLIT.en / SPLIT.de files (default: the shared Multi30k)")
    parser.add_argument("--output", required=True, help="the directory to write the lowercased tokenized files to")
    args = parser.parse_args(argv)
    if pathlib.Path(args.output).resolve() == pathlib.Path(args.data).resolve():
        parser.error("--output must not be --data: it would overwrite the raw text")
    if not have_moses():
        sys.exit(f"multi30k_lc_tok: {MOSES_MISSING}")
    try:
        written = write_lc_tok(args.data, args.output)
    except FileNotFoundError as error:
        parser.error(str(error))
    for path in written:
        print(f"# {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
