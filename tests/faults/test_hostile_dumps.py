"""Damaged and forged Wikipedia dumps through a real ``prepare``: every page is read or counted as
skipped with its reason, and a dump that cannot be read is named with what is wrong with it.

The dumps are the bundled excerpts (``tests/data/wiki``), damaged here as a broken download, a bad
edit or an attacker would damage them: a page without its ``</page>``, a raw ``</page>`` inside a
text, a reference to a surrogate (``&#xD800;``), a page of 9 MiB, a multistream dump cut short
then made whole, an index with a wrong offset, bytes appended after the last bz2 stream.
"""

from __future__ import annotations

import bz2
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from faults.helpers import REPO, VOCAB, shard_table

WIKI = REPO / "tests" / "data" / "wiki"
TABLES = WIKI / "enwiki-table-markup.xml.bz2"  # 5 articles
SINGLE = WIKI / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"  # 206 pages
MULTI = WIKI / "enwiki-shortened-pages-articles-multistream.xml.bz2"  # the same 206 pages
MULTI_INDEX = WIKI / "enwiki-shortened-pages-articles-multistream-index.txt.bz2"
PAGES = 206
SPLIT = "300KB"  # MULTI in 4 tasks, cut at its streams 576501, 1075205 and 1618059


def cli(*args, code: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ}
    if env.get("PYTHONPATH"):  # the same package from the test's working directory
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep))
    proc = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def prepare(*inputs, out: Path, code: int = 0, split: str = SPLIT) -> subprocess.CompletedProcess:
    return cli("prepare", *inputs, "-o", out, "-t", VOCAB, "--workers", "1", "--split-size", split,
               "--dupe-factor", "1", "--no-progress", code=code)


def totals(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())["totals"]


def pages_seen(t: dict) -> int:
    return t["documents_read"] + sum(t["documents_skipped"].values())


def xml_dump(folder: Path, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "enwiki-test-pages-articles.xml"
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def tables_xml() -> bytes:
    return bz2.decompress(TABLES.read_bytes())


@pytest.fixture(scope="module")
def tables_clean(tables_xml, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("tables-clean") / "out"
    prepare(xml_dump(out.parent / "in", tables_xml), out=out)
    t = totals(out)
    assert pages_seen(t) == tables_xml.count(b"<page>") == 5
    return t


def _page_of(xml: bytes, n: int) -> tuple[int, int]:
    """Bytes ``[start, end)`` of the ``n``-th page (``</page>`` included)."""
    start = -1
    for _ in range(n + 1):
        start = xml.index(b"<page>", start + 1)
    return start, xml.index(b"</page>", start) + len(b"</page>")


def _title(xml: bytes, n: int) -> str:
    start, end = _page_of(xml, n)
    page = xml[start:end]
    return page[page.index(b"<title>") + 7 : page.index(b"</title>")].decode()


def test_a_page_without_its_end_tag_is_skipped_and_the_next_one_read(tables_xml, tables_clean, tmp_path, tally):
    """Without its ``</page>`` a page ran on into the next one, which vanished (the first page's
    title over the second one's text, one page fewer counted, exit 0, no word)."""
    _, end = _page_of(tables_xml, 1)
    dump = xml_dump(tmp_path / "in", tables_xml[: end - len(b"</page>")] + tables_xml[end:])
    out = tmp_path / "out"
    proc = prepare(dump, out=out)
    t = totals(out)
    assert pages_seen(t) == 5
    assert t["documents_skipped"].get("bad_page") == 1
    assert t["documents_read"] == tables_clean["documents_read"] - 1
    assert f"the page {_title(tables_xml, 1)!r} is skipped: it has no </page>" in proc.stderr
    tally.record("dump page without </page>")


def test_a_raw_end_tag_inside_a_text_skips_that_page_only(tables_xml, tables_clean, tmp_path, tally):
    """A raw ``</page>`` inside a text (XML escapes it, so only a damaged or forged dump has one)
    ended the page there: the article was read cut short and counted as whole."""
    start, end = _page_of(tables_xml, 2)
    at = tables_xml.index(b"\n", (start + end) // 2)
    dump = xml_dump(tmp_path / "in", tables_xml[:at] + b"</page>" + tables_xml[at:])
    out = tmp_path / "out"
    proc = prepare(dump, out=out)
    t = totals(out)
    assert pages_seen(t) == 5
    assert t["documents_skipped"].get("bad_page") == 1
    assert t["documents_read"] == tables_clean["documents_read"] - 1
    assert f"the page {_title(tables_xml, 2)!r} is skipped: its <text> has no </text> before </page>" in proc.stderr
    tally.record("raw </page> inside a text")


def test_a_surrogate_reference_is_replaced_and_counted(tables_xml, tables_clean, tmp_path, tally):
    """``&#xD800;`` (a UTF-16 surrogate: no character) killed the task with a UnicodeEncodeError
    that named no page."""
    start, end = _page_of(tables_xml, 0)
    at = tables_xml.index(b"</text>", start)
    dump = xml_dump(tmp_path / "in", tables_xml[:at] + b" Surrogates &#xD800; and &#56320; here." + tables_xml[at:])
    out = tmp_path / "out"
    prepare(dump, out=out)
    t = totals(out)
    assert pages_seen(t) == 5 and t["documents_read"] == tables_clean["documents_read"]
    assert t["documents_with_replaced_bytes"] == 1
    tally.record("surrogate character reference")


def test_a_page_over_the_cap_is_cut_and_counted(tables_xml, tables_clean, tmp_path, tally):
    """A 9 MiB page (Wikipedia accepts 2 MiB of wikitext a page): read up to the 8 MiB cap,
    counted in ``pages_cut``, without holding the rest."""
    filler = ("x" * 99 + "\n") * (9 * 1024 * 1024 // 100)
    huge = ('<page><title>Huge</title><ns>0</ns><id>1</id><revision><id>2</id><text xml:space="preserve">'
            f"Huge is a page of the test.\n&lt;!-- {filler} --&gt;\nIts end.</text></revision></page>\n  ")
    at = tables_xml.index(b"<page>")
    dump = xml_dump(tmp_path / "in", tables_xml[:at] + huge.encode() + tables_xml[at:])
    out = tmp_path / "out"
    proc = prepare(dump, out=out)
    t = totals(out)
    assert pages_seen(t) == 6 and t["documents_read"] == tables_clean["documents_read"] + 1
    assert t["pages_cut"] == 1
    assert f"the page 'Huge' is longer than {8 << 20} bytes of XML" in proc.stderr
    report = cli("report", out).stdout
    assert "1 Wikipedia dump page(s) longer than 8 MiB of XML were read up to that size only" in report
    tally.record("dump page over the cap")


@pytest.fixture(scope="module")
def multi_clean(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("multi-clean") / "out"
    prepare(MULTI, out=out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert pages_seen(manifest["totals"]) == PAGES and len(manifest["shards"]) == 4
    return manifest


def _multi_copy(folder: Path, data: bytes | None = None, index: bytes | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / MULTI_INDEX.name).write_bytes(MULTI_INDEX.read_bytes() if index is None else index)
    dump = folder / MULTI.name
    dump.write_bytes(MULTI.read_bytes() if data is None else data)
    return dump


def test_a_multistream_dump_cut_before_its_last_piece_resumes_once_whole(multi_clean, tmp_path, tally):
    """A download cut short before the dump's last streams: the tasks past its end fail, naming
    it incomplete; once it is whole the same command resumes (it was refused as "other settings":
    the plan was cut by the file's size, not by its index)."""
    dump = _multi_copy(tmp_path / "in", MULTI.read_bytes()[:1_100_000])
    out = tmp_path / "out"
    proc = prepare(dump, out=out, code=2)
    assert "lists streams up to byte 1618059: the dump is incomplete" in proc.stderr
    assert f"{dump}: truncated: the file ends at byte 1100000, before the bz2 stream at byte 1618059" in proc.stderr
    assert "2 of 4 tasks failed, the other 2 completed" in proc.stderr
    shutil.copy(MULTI, dump)  # the download finished
    proc = prepare(dump, out=out)
    assert "only in tasks not completed yet" in proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert shard_table(manifest) == shard_table(multi_clean)
    assert manifest["totals"] == multi_clean["totals"]
    tally.record("multistream dump cut before its last piece")


def test_a_wrong_index_offset_is_blamed_on_the_index(multi_clean, tmp_path, tally):
    """An index whose offset of a stream is wrong (here the stream at 1075205 listed at 1075300):
    the error names the index, not the dump (it said "corrupt bz2 data" in the dump); with the
    right index the same command completes the run, redoing the failed tasks."""
    index = bz2.decompress(MULTI_INDEX.read_bytes())
    assert b"\n1075205:" in index
    bad = bz2.compress(index.replace(b"\n1075205:", b"\n1075300:"))
    dump = _multi_copy(tmp_path / "in", index=bad)
    out = tmp_path / "out"
    # 5 tasks, cut at 112682, 576501, 1075300 and 1618059: planning checks the first two and the
    # last cut; the third one is the task's to check
    proc = prepare(dump, out=out, code=2, split="100KB")
    index_path = tmp_path / "in" / MULTI_INDEX.name
    assert f"{index_path}: its stream offset 1075300 is not the start of a bz2 stream in {dump}" in proc.stderr
    assert "2 of 5 tasks failed, the other 3 completed" in proc.stderr
    assert "corrupt bz2 data" not in proc.stderr
    shutil.copy(MULTI_INDEX, index_path)  # the tasks that completed read the same streams
    prepare(dump, out=out, split="100KB")
    t = totals(out)
    assert pages_seen(t) == PAGES and t["documents_read"] == multi_clean["totals"]["documents_read"]
    tally.record("wrong multistream index offset")


@pytest.mark.parametrize("kind", ["multistream", "single-stream"])
def test_bytes_appended_to_a_bz2_dump_are_ignored_and_counted_alike(kind, multi_clean, tmp_path, tally):
    """Bytes that are not bz2 data after the last stream (as ``bzip2 -d`` says: trailing garbage,
    ignored): a multistream dump ignored them without a word, a single-stream dump cut into
    several tasks failed as corrupt. Now both read every page and count the bytes."""
    garbage = b"<html>404 Not Found</html>\n" * 100
    if kind == "multistream":
        dump = _multi_copy(tmp_path / "in", MULTI.read_bytes() + garbage)
    else:
        (tmp_path / "in").mkdir()
        dump = tmp_path / "in" / SINGLE.name
        dump.write_bytes(SINGLE.read_bytes() + garbage)
    out = tmp_path / "out"
    proc = prepare(dump, out=out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["shards"]) > 1  # several tasks
    t = manifest["totals"]
    assert pages_seen(t) == PAGES
    assert t["documents_skipped"] == multi_clean["totals"]["documents_skipped"]
    assert t["documents_read"] == multi_clean["totals"]["documents_read"]
    assert t["trailing_bytes_ignored"] == len(garbage)
    assert f"the {len(garbage)} bytes after its last bz2 stream" in proc.stderr
    if kind == "multistream":
        assert shard_table(manifest) == shard_table(multi_clean)
    tally.record(f"garbage appended to a {kind} dump")
