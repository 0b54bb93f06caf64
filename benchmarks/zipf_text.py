#!/usr/bin/env python
"""Text with a long tail of distinct words, for measuring what grows with the vocabulary of a corpus.

Repeating a real corpus up to a benchmark's size (what ``prepare_bench.py`` does) repeats its
words too: WikiText-2 holds about 33,000 distinct words, so after its first copy every word is one
the tokenizer has seen, and caches keyed by words never grow. Real corpora keep meeting new words
(Heaps' law). This script writes sentences whose words follow Zipf's law over a ranked lexicon:
the source's words by frequency first, then made-up lowercase words for the rarer ranks, so the
head of the distribution is real text's and the tail never ends. With the defaults, 110 MB hold
about 19 million words and 1.5 million distinct ones.

    python benchmarks/zipf_text.py --source path/to/wikitext2-train.txt --size 100MB --out path/to/zipf-100MB.txt
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_bench import DEFAULT_SOURCE, parse_size  # noqa: E402

LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


def lexicon(source: Path, types: int, rng: np.random.Generator) -> np.ndarray:
    """``types`` distinct words: the source's words by frequency (ties in first-seen order; not
    ``<unk>``, nor the "." that ends every sentence here), then made-up words of 5 to 12 letters."""
    counts = collections.Counter(source.read_text(encoding="utf-8").split())
    ranked = dict.fromkeys(w for w, _ in counts.most_common() if w not in ("<unk>", "."))
    ranked = dict.fromkeys(list(ranked)[:types])
    while len(ranked) < types:  # made-up words, without repeats or real words among them
        lengths = rng.integers(5, 13, types - len(ranked))
        letters = LETTERS[rng.integers(0, len(LETTERS), int(lengths.sum()))]
        ranked.update(dict.fromkeys("".join(w) for w in np.split(letters, np.cumsum(lengths)[:-1])))
    return np.array(list(ranked)[:types], dtype=object)


def write(out: Path, size: int, words: np.ndarray, exponent: float,
          rng: np.random.Generator) -> tuple[int, int, int]:
    """Sentences of 8 to 30 words drawn by rank with probability proportional to
    ``rank ** -exponent``, each ended by " .", one per line, a blank line after every 8 (documents);
    returns the bytes, the words (not counting the "." ends) and the distinct words written."""
    p = np.arange(1, len(words) + 1, dtype=np.float64) ** -exponent
    p /= p.sum()
    seen = np.zeros(len(words), dtype=bool)
    written = count = 0
    with open(out, "w", encoding="utf-8") as f:
        while written < size:
            ranks = rng.choice(len(words), size=1 << 20, p=p)
            lengths = rng.integers(8, 31, len(ranks) // 8)
            ends = np.cumsum(lengths)
            ends = ends[ends <= len(ranks)]  # whole sentences only
            lines = []
            for i, end in enumerate(ends):
                lines.append(" ".join(words[ranks[end - lengths[i]:end]]) + " .")
                if i % 8 == 7 and i + 1 < len(ends):
                    lines.append("")
            text = "\n".join(lines) + "\n\n"
            f.write(text)
            written += len(text.encode("utf-8"))
            count += int(ends[-1])
            seen[ranks[: ends[-1]]] = True
    return written, count, int(seen.sum())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE,
                    help="real text whose words, ranked by frequency, are the head of the lexicon "
                         "(default: the bundled 1 MB WikiText-2 sample)")
    ap.add_argument("--size", type=parse_size, default=parse_size("100MB"), help="at least this many bytes")
    ap.add_argument("--types", type=int, default=3_000_000, help="size of the lexicon (real words, then made-up)")
    ap.add_argument("--exponent", type=float, default=1.05, help="Zipf exponent")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    words = lexicon(args.source, args.types, rng)
    written, count, distinct = write(args.out, args.size, words, args.exponent, rng)
    print(f"{args.out.name}: {written:,} bytes, {count:,} words ({distinct:,} distinct), not counting the "
          f"\".\" that ends each sentence; a lexicon of {len(words):,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
