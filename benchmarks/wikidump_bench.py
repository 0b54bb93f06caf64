#!/usr/bin/env python
"""Throughput of reading a Wikipedia dump on one core: MB of dump XML per second, from the
``.bz2`` to plain text, ours against mwparserfromhell's ``strip_code`` in the same run.

Every variant reads the same pages the same way (decompression, ``<page>`` scan, namespace /
redirect / disambiguation filters) and differs only in the wikitext cleaner; one more variant is
the whole reader (``read_dump_piece``: sentences too). Variants run in turn, ``--repeats``
rounds in a rotated order, in this one process; the figures are CPU seconds of this process
(``time.process_time``), so other load on a shared machine counts less than in wall time (it
still slows CPU work through shared caches and SMT siblings: read the ratios, measured in the
same rounds, rather than the absolute MB/s). Reported: the best round (other load only ever
slows a run) and the median.

    python benchmarks/wikidump_bench.py                      # the bundled dump excerpts
    python benchmarks/wikidump_bench.py enwiki-20261101-pages-articles-multistream.xml.bz2 \\
        --limit-mb 200 --json benchmarks/results/wikidump.json

Variants:

  decompress   the bz2 decompression alone, as the reader of whole streams does it
               (``indexed_bzip2``: multistream pieces, or a whole file as one piece)
  decompress-stdlib  the same with the standard library's decompressor, as the reader of a
               piece of a dump without index does it (``bz2blocks.owned_blocks``)
  ours         decompress + page scan + filters + ``clean_wikitext`` (paragraphs)
  ours-stdlib  the same with ``decompress-stdlib``: a piece of a dump without index
  ours+sent    ``read_dump_piece``: the above + sentence segmentation (documents as trained on)
  mwph         decompress + page scan + filters + ``mwparserfromhell.parse(text).strip_code()``
  prepare      the whole ``prepare`` from the dump, as one task in this process (one worker,
               NSP + static masking, TFRecord, dupe factor 1, ``--tokenizer``, default the
               bundled bert-base-uncased vocab): reading, tokenizing, instances, masking and
               writing; reported also as a ratio to ``ours+sent`` (the reader alone) of the
               same round
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from mlm_pipeline.read import wikidump  # noqa: E402
from mlm_pipeline.read.bz2blocks import owned_blocks, whole_streams  # noqa: E402
from mlm_pipeline.read.wikitext import clean_wikitext  # noqa: E402
from mlm_pipeline.stats import ReadStats  # noqa: E402

BUNDLED = [
    REPO / "tests/data/wiki/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
    REPO / "tests/data/wiki/enwiki-shortened-pages-articles-multistream.xml.bz2",
]
VARIANTS = ("decompress", "decompress-stdlib", "ours", "ours-stdlib", "ours+sent", "mwph", "prepare")
WHOLE_FILE = ("ours+sent", "prepare")
"""Variants that read whole files (left out with ``--limit-mb``)."""
VOCAB = REPO / "sample" / "bert-base-uncased-vocab.txt"


class Limit(Exception):
    pass


def _chunks(url: str, meta: dict, f, limit: int, stdlib: bool = False):
    """The decoded data of the whole dump as the reader of one whole-file piece gets it
    (``indexed_bzip2``), or, with ``stdlib``, as the reader of a piece of a dump without
    index does (``bz2blocks.owned_blocks``: the standard library's decompressor); stopping
    after ``limit`` bytes."""
    if meta["kind"] == "xml":
        source = ((data, True) for data in iter(lambda: f.read(1 << 20), b""))
    elif stdlib:
        source = owned_blocks(f, url, 0, None)
    else:
        source = whole_streams(f, url, 0, None)
    seen = 0
    for data, owned in source:
        yield data, owned
        seen += len(data)
        if seen >= limit:
            return


def _pages(url: str, meta: dict, limit: int, stdlib: bool = False):
    """(page, xml bytes so far) of the kept articles of the first ``limit`` bytes of XML."""
    keep = wikidump.WikiOptions().namespaces
    with open(url, "rb") as f:
        chunks = _chunks(url, meta, f, limit, stdlib)
        for raw in wikidump.owned_pages(chunks, meta["encoding"]):
            page = wikidump.parse_page(raw.decode(meta["encoding"], "replace"))
            ns = page.ns if page.ns is not None else 0
            if ns not in keep or page.redirect or wikidump.is_disambiguation(page.text):
                continue
            yield page


def prepare_config(url: str, output: str, tokenizer: str):
    """``prepare`` of the whole dump as one task in this process: one worker, NSP with static
    masking, TFRecord, dupe factor 1."""
    from mlm_pipeline.config import build_config

    return build_config({
        "inputs": [url], "output": output, "tokenizer": tokenizer, "workers": 1, "progress": False,
        "format": "tfrecord", "dupe_factor": 1, "split_bytes": "1000GB",
    })


def run_prepare_once(url: str, tokenizer: str) -> None:
    import shutil
    import tempfile

    from mlm_pipeline.pipeline import run_prepare

    out = tempfile.mkdtemp(prefix="wikidump-bench-")
    try:
        run_prepare(prepare_config(url, out, tokenizer), show_progress=False)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def run_variant(
    variant: str, url: str, meta: dict, limit: int, tokenizer: str = str(VOCAB)
) -> tuple[float, float]:
    """(cpu seconds, wall seconds) of one variant over the dump's first ``limit`` bytes."""
    t0, w0 = time.process_time(), time.perf_counter()
    if variant.startswith("decompress"):
        with open(url, "rb") as f:
            for _ in _chunks(url, meta, f, limit, stdlib=variant == "decompress-stdlib"):
                pass
    elif variant in ("ours", "ours-stdlib"):
        for page in _pages(url, meta, limit, stdlib=variant == "ours-stdlib"):
            clean_wikitext(page.text)
    elif variant == "mwph":
        import mwparserfromhell

        for page in _pages(url, meta, limit):
            mwparserfromhell.parse(page.text).strip_code()
    elif variant == "ours+sent":
        stats = ReadStats()
        for _ in wikidump.read_dump_piece(url, 0, None, meta, wikidump.WikiOptions(), stats):
            pass
    elif variant == "prepare":
        run_prepare_once(url, tokenizer)
    return time.process_time() - t0, time.perf_counter() - w0


def xml_bytes(url: str, meta: dict, limit: int) -> int:
    with open(url, "rb") as f:
        return sum(len(d) for d, _ in _chunks(url, meta, f, limit))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("dumps", nargs="*", help="dump files (default: the bundled excerpts)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument(
        "--limit-mb", type=float, default=0, help="read only this many MB of XML (0: all)"
    )
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--tokenizer", default=str(VOCAB), help="vocab.txt or tokenizer.json of 'prepare'")
    args = ap.parse_args()
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; expected some of {VARIANTS}")
    dumps = args.dumps or [str(p) for p in BUNDLED]
    results = {"machine": platform.platform(), "python": platform.python_version(), "dumps": []}
    for url in dumps:
        meta = wikidump.split_dump(url, 1 << 62)[0][2]
        limit = int(args.limit_mb * 1e6) if args.limit_mb else 1 << 62
        if args.limit_mb and any(v in WHOLE_FILE for v in variants):
            print(f"({', '.join(WHOLE_FILE)} read whole files: left out with --limit-mb)")
            variants = [v for v in variants if v not in WHOLE_FILE]
        size = xml_bytes(url, meta, limit)
        cpu: dict[str, list[float]] = {v: [] for v in variants}
        wall: dict[str, list[float]] = {v: [] for v in variants}
        for r in range(args.repeats):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for v in order:
                c, w = run_variant(v, url, meta, limit, args.tokenizer)
                cpu[v].append(c)
                wall[v].append(w)
        entry = {"dump": Path(url).name, "kind": meta["kind"], "xml_mb": size / 1e6, "variants": {}}
        print(
            f"\n{Path(url).name}  ({meta['kind']}, {size / 1e6:.2f} MB of XML, "
            f"{args.repeats} rounds; MB of XML per CPU second, wall: per second)"
        )
        print(f"  {'variant':18s} {'best MB/s':>10s} {'median MB/s':>12s} {'wall median':>12s}")
        for v in variants:
            best, med = min(cpu[v]), statistics.median(cpu[v])
            entry["variants"][v] = {
                "cpu_s": cpu[v],
                "wall_s": wall[v],
                "best_mb_per_cpu_s": size / best / 1e6,
                "median_mb_per_cpu_s": size / med / 1e6,
                "median_mb_per_wall_s": size / statistics.median(wall[v]) / 1e6,
            }
            print(
                f"  {v:18s} {size / best / 1e6:10.1f} {size / med / 1e6:12.1f} "
                f"{size / statistics.median(wall[v]) / 1e6:12.1f}"
            )
        if "ours" in cpu and "mwph" in cpu:
            ratios = [m / o for m, o in zip(cpu["mwph"], cpu["ours"])]
            entry["ours_vs_mwph_median_ratio"] = statistics.median(ratios)
            print(
                f"  ours is {statistics.median(ratios):.1f}x mwparserfromhell "
                "(median of per-round ratios)"
            )
        if "prepare" in cpu and "ours+sent" in cpu:
            # prepare's MB/s over the reader's = the reader's seconds over prepare's
            ratios = [r / p for r, p in zip(cpu["ours+sent"], cpu["prepare"])]
            entry["prepare_vs_reader_median_ratio"] = statistics.median(ratios)
            entry["prepare_vs_reader_best_ratio"] = min(cpu["ours+sent"]) / min(cpu["prepare"])
            print(
                f"  prepare runs at {statistics.median(ratios):.2f}x the reader's MB/s (median of "
                f"per-round ratios; best-of {entry['prepare_vs_reader_best_ratio']:.2f}x)"
            )
        results["dumps"].append(entry)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
