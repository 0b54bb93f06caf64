"""The Wikipedia dump reader on real dump excerpts: counts, splitting, encodings, errors."""

from __future__ import annotations

import bz2
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlm_pipeline.errors import InputError
from mlm_pipeline.read.bz2blocks import owned_blocks, whole_streams
from mlm_pipeline.read.wikidump import (
    WikiOptions,
    dump_encoding,
    find_index,
    is_disambiguation,
    is_wikidump,
    owned_pages,
    parse_page,
    read_dump_piece,
    read_header,
    read_stream_offsets,
    split_dump,
)
from mlm_pipeline.stats import ReadStats

WIKI = Path(__file__).resolve().parents[1] / "data" / "wiki"
SINGLE = WIKI / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
MULTI = WIKI / "enwiki-shortened-pages-articles-multistream.xml.bz2"
MULTI_INDEX = WIKI / "enwiki-shortened-pages-articles-multistream-index.txt.bz2"
TABLES = WIKI / "enwiki-table-markup.xml.bz2"
TABLES_MULTI = WIKI / "enwiki-table-markup-multistream.xml.bz2"
BGWIKI = WIKI / "bgwiki-latest-pages-articles-shortened.xml.bz2"

SAMPLE_SKIPS = {"namespace": 1, "redirect": 99, "disambiguation": 8}
SAMPLE_ARTICLES = 98  # 206 pages - 100 redirects (one of them in namespace 4) - 8 disambiguation
DISAMBIGUATION_TITLES = [
    "Alien", "Austin (disambiguation)", "Ada", "Aberdeen (disambiguation)",
    "Argument (disambiguation)", "Animal (disambiguation)", "Asia Minor (disambiguation)",
    "Aa River",
]


def read_dump(path, target_bytes=10**12, options=None, index_url=None):
    """Documents and stats of a dump read through ``split_dump``'s pieces, in order."""
    stats = ReadStats()
    docs = []
    pieces = split_dump(str(path), target_bytes, index_url=index_url)
    for start, end, meta in pieces:
        docs.extend(read_dump_piece(str(path), start, end, meta, options or WikiOptions(), stats))
    return docs, stats, pieces


@pytest.fixture(scope="module")
def whole_sample():
    return read_dump(SINGLE)


@pytest.fixture(scope="module")
def plain_xml(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("wiki") / "enwiki-pages-articles.xml"
    path.write_bytes(bz2.decompress(SINGLE.read_bytes()))
    return path


def all_pages(path) -> list:
    data = bz2.decompress(Path(path).read_bytes())
    encoding = dump_encoding(data)
    return [parse_page(raw.decode(encoding)) for raw in owned_pages(iter([(data, True)]), encoding)]


# --------------------------------------------------------------------------- counts


def test_sample_counts(whole_sample):
    docs, stats, pieces = whole_sample
    pages = all_pages(SINGLE)
    assert len(pages) == 206
    assert sum(p.redirect for p in pages) == 100
    assert sum(not p.redirect for p in pages) == 106
    assert [p.title for p in pages if p.ns != 0] == ["Wikipedia:Adding Wikipedia articles to Nupedia"]
    assert len(pieces) == 1 and pieces[0][2]["kind"] == "bz2"
    assert len(docs) == stats.documents_read == SAMPLE_ARTICLES
    assert dict(stats.documents_skipped) == SAMPLE_SKIPS
    assert stats.sentences == sum(map(len, docs))
    assert stats.bytes_read == SINGLE.stat().st_size
    assert all(doc and all(s and s == s.strip() for s in doc) for doc in docs)
    assert docs[0][0] == (
        "Anarchism is a political philosophy that advocates self-governed societies based on "
        "voluntary institutions."
    )


def test_disambiguation_pages_by_template_not_title():
    pages = all_pages(SINGLE)
    found = [p.title for p in pages if not p.redirect and is_disambiguation(p.text)]
    assert found == DISAMBIGUATION_TITLES
    assert sum("(disambiguation)" in t for t in found) == 5  # a title test misses 3


@pytest.mark.parametrize(
    "text, expected",
    [
        ("x\n{{disambiguation}}", True),
        ("{{Disambiguation|geo}}", True),
        ("{{ DAB }}", True),
        ("{{geodis}}", True),
        ("{{hndis|Smith, John}}", True),
        ("{{Set_index article}}", True),
        ("{{Template:Disambig}}", True),
        ("{{Airport disambiguation}}", True),
        ("<!-- {{disambiguation}} -->", False),
        ("Paris{{disambiguation needed|date=May 2020}} is", False),
        ("{{Dablink|x}}", False),
        ("{{Distinguish|Dab}}", False),
    ],
)
def test_is_disambiguation(text, expected):
    assert is_disambiguation(text) is expected


# --------------------------------------------------------------------------- splitting


@pytest.mark.parametrize("target", [600_000, 150_000, 61_441, 20_011])
def test_single_stream_pieces_read_every_page_once(whole_sample, target):
    docs, stats, pieces = read_dump(SINGLE, target)
    assert len(pieces) == -(-SINGLE.stat().st_size // target)
    assert docs == whole_sample[0]
    assert dict(stats.documents_skipped) == SAMPLE_SKIPS
    assert stats.bytes_read == SINGLE.stat().st_size


@pytest.mark.parametrize("target", [10**9, 400_000, 1])
def test_multistream_pieces_are_whole_streams(whole_sample, target):
    assert find_index(str(MULTI)) == str(MULTI_INDEX)
    offsets = read_stream_offsets(str(MULTI_INDEX))
    assert offsets == [638, 112682, 576501, 1075205, 1618059]
    docs, stats, pieces = read_dump(MULTI, target)
    assert {meta["kind"] for _, _, meta in pieces} == {"multistream"}
    assert pieces[0][0] == 0 and pieces[-1][1] is None
    assert all(start in offsets for start, _, _ in pieces[1:])
    if target == 1:  # one piece per page stream (the header rides with the first)
        assert [s for s, _, _ in pieces] == [0, *offsets[1:]]
    assert docs == whole_sample[0]  # the same documents as the single-stream file
    assert dict(stats.documents_skipped) == SAMPLE_SKIPS
    assert stats.bytes_read == MULTI.stat().st_size


def test_multistream_read_without_index_is_cut_evenly(whole_sample, tmp_path):
    copy = tmp_path / "enwiki-pages-articles-multistream.xml.bz2"  # no index beside it
    shutil.copyfile(MULTI, copy)
    docs, stats, pieces = read_dump(copy, 100_000)
    assert {meta["kind"] for _, _, meta in pieces} == {"bz2"} and len(pieces) == 18
    assert docs == whole_sample[0]
    assert dict(stats.documents_skipped) == SAMPLE_SKIPS
    explicit = read_dump(copy, 400_000, index_url=str(MULTI_INDEX))
    assert explicit[0] == whole_sample[0]
    assert {meta["kind"] for _, _, meta in explicit[2]} == {"multistream"}


def test_index_of_another_dump_is_refused():
    with pytest.raises(InputError, match="not the start of a bz2 stream"):
        split_dump(str(SINGLE), 100_000, index_url=str(MULTI_INDEX))


def _index_edited(tmp_path, edit) -> Path:
    lines = bz2.decompress(MULTI_INDEX.read_bytes()).decode().splitlines()
    path = tmp_path / "edited-multistream-index.txt.bz2"
    path.write_bytes(bz2.compress(("\n".join(edit(*ln.split(":", 2)) for ln in lines) + "\n").encode()))
    return path


@pytest.mark.parametrize("target", [10**9, 400_000])
def test_a_wrong_index_is_refused_at_planning_even_for_one_task(tmp_path, target):
    """Another dump's index (the table excerpt's, whose streams are elsewhere), one with shifted
    offsets, and one whose offsets are stream starts but whose pages are another dump's: each is
    refused naming the index and what is wrong, also when the dump is one task (no cut to check:
    it was taken silently, the whole dump read by one worker)."""
    other = str(TABLES_MULTI.with_name("enwiki-table-markup-multistream-index.txt.bz2"))
    with pytest.raises(InputError, match=rf"{other}: its stream offset 190 is not the start of a bz2 stream in .*"
                                         r"another dump's; give the dump's own index"):
        split_dump(str(MULTI), target, index_url=other)
    shifted = _index_edited(tmp_path, lambda o, i, t: f"{int(o) + 5}:{i}:{t}")
    with pytest.raises(InputError, match=rf"{shifted}: its stream offset \d+ is not the start of a bz2 stream"):
        split_dump(str(MULTI), target, index_url=str(shifted))
    renumbered = _index_edited(tmp_path, lambda o, i, t: f"{o}:{int(i) + 1000}:{t}")
    with pytest.raises(InputError, match=rf"{renumbered}: lists page 1010 first in the stream at byte 638 of "
                                         rf"{MULTI}, but that stream starts with page 10: the index of another dump"):
        split_dump(str(MULTI), target, index_url=str(renumbered))
    past = _index_edited(tmp_path, lambda o, i, t: f"{int(o) + 10**7}:{i}:{t}")
    with pytest.raises(InputError, match=r"its first stream offset 10000638 lies past the end of"):
        split_dump(str(MULTI), target, index_url=str(past))
    assert len(split_dump(str(MULTI), target, index_url=str(MULTI_INDEX))) == (1 if target == 10**9 else 4)


def test_a_wrong_index_makes_prepare_exit_2_naming_it(tmp_path):
    other = TABLES_MULTI.with_name("enwiki-table-markup-multistream-index.txt.bz2")
    proc = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "prepare", str(MULTI), "--wiki-index", str(other),
                           "-o", str(tmp_path / "out"), "-t", str(Path(__file__).resolve().parents[2] / "sample" /
                                                                  "bert-base-uncased-vocab.txt")],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert f"{other}: its stream offset 190 is not the start of a bz2 stream" in proc.stderr


@pytest.mark.parametrize("target", [10**9, 250_000, 77_777, 4099])
def test_plain_xml_pieces_read_every_page_once(whole_sample, plain_xml, target):
    docs, stats, pieces = read_dump(plain_xml, target)
    assert {meta["kind"] for _, _, meta in pieces} == {"xml"}
    assert docs == whole_sample[0]
    assert dict(stats.documents_skipped) == SAMPLE_SKIPS
    assert stats.bytes_read == plain_xml.stat().st_size


def _multi_stream_file(tmp_path) -> tuple[Path, bytes]:
    """Pages of the sample compressed as pbzip2 does: many streams of small (100 kB) blocks,
    so stream ends and block starts fall at every bit alignment; one stream is empty."""
    data = bz2.decompress(SINGLE.read_bytes())[:1_500_000]
    parts = [data[i : i + 260_000] for i in range(0, len(data), 260_000)]
    streams = [bz2.compress(p, compresslevel=1) for p in parts]
    streams.insert(2, bz2.compress(b""))
    path = tmp_path / "pbzip2-like.xml.bz2"
    path.write_bytes(b"".join(streams))
    return path, data


def _owned_data(path: Path, cuts: list[int]) -> bytes:
    size = path.stat().st_size
    bounds = [0, *sorted({c for c in cuts if 0 < c < size})]
    out = []
    with open(path, "rb") as f:
        for start, end in zip(bounds, [*bounds[1:], None]):
            for data, owned in owned_blocks(f, str(path), start, end):
                if not owned:
                    break
                out.append(data)
    return b"".join(out)


def test_block_ranges_tile_the_decoded_data(tmp_path):
    path, data = _multi_stream_file(tmp_path)
    size = path.stat().st_size
    for step in (size, 50_000, 9_973, 1_000):
        assert _owned_data(path, list(range(step, size, step))) == data
    assert _owned_data(SINGLE, list(range(0, SINGLE.stat().st_size, 123_457))) == bz2.decompress(
        SINGLE.read_bytes()
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(min_value=1, max_value=10**6), max_size=12))
def test_block_ranges_tile_for_any_cuts(tmp_path, cuts):
    path, data = _multi_stream_file(tmp_path)
    size = path.stat().st_size
    assert _owned_data(path, [c * size // 10**6 for c in cuts]) == data


def test_continuation_after_the_owned_blocks_is_the_next_data():
    full = bz2.decompress(SINGLE.read_bytes())
    with open(SINGLE, "rb") as f:
        chunks = list(owned_blocks(f, str(SINGLE), 0, 300_000))
    owned = b"".join(d for d, o in chunks if o)
    after = b"".join(d for d, o in chunks if not o)
    assert [o for _, o in chunks] == sorted((o for _, o in chunks), reverse=True)
    assert full.startswith(owned + after) and len(owned) + len(after) == len(full)
    with open(MULTI, "rb") as f:
        chunks = list(whole_streams(f, str(MULTI), 0, 112682))
    owned = b"".join(d for d, o in chunks if o)
    assert owned + b"".join(d for d, o in chunks if not o) == full


# --------------------------------------------------------------------------- encodings, headers


def test_utf16_dump(tmp_path):
    docs, stats, pieces = read_dump(BGWIKI)
    assert pieces[0][2]["encoding"] == "utf-16-le"
    namespaces = pieces[0][2]["namespaces"]
    assert namespaces["Файл"] == 6 and namespaces["Категория"] == 14
    assert len(docs) == 1 and dict(stats.documents_skipped) == {"namespace": 2}
    assert docs[0][0].startswith("Григорианският календар")
    text = " ".join(docs[0])
    assert "Файл:" not in text and "Категория:" not in text and "[[" not in text
    kept = read_dump(BGWIKI, options=WikiOptions(namespaces={0, 4}))
    assert len(kept[0]) == 3 and not kept[1].documents_skipped
    # plain UTF-16 XML, cut at odd and even offsets, and as bz2 blocks
    plain = tmp_path / "bgwiki-pages-articles.xml"
    plain.write_bytes(bz2.decompress(BGWIKI.read_bytes()))
    for target in (10**9, 100_001, 30_000, 7_777):
        assert read_dump(plain, target, options=WikiOptions(namespaces={0, 4}))[0] == kept[0]
    for target in (20_000, 5_000):
        assert read_dump(BGWIKI, target, options=WikiOptions(namespaces={0, 4}))[0] == kept[0]


def test_dump_without_siteinfo():
    header = read_header(str(TABLES))
    assert header == {"encoding": "utf-8", "namespaces": {}}
    docs, stats, _ = read_dump(TABLES)
    assert len(docs) == 5 and not stats.documents_skipped
    assert read_dump(TABLES_MULTI, 1)[0] == docs
    assert read_dump(TABLES, 20_000)[0] == docs


def test_siteinfo_namespaces():
    namespaces = read_header(str(SINGLE))["namespaces"]
    assert namespaces["Wikipedia"] == 4 and namespaces["File"] == 6 and namespaces["Category"] == 14
    assert len(namespaces) > 30


def test_detection():
    head = bz2.decompress(SINGLE.read_bytes())[:4096]
    assert is_wikidump(head)
    assert is_wikidump(b'<?xml version="1.0" encoding="utf-8"?>\n' + head)
    assert is_wikidump(bz2.decompress(BGWIKI.read_bytes())[:4096])
    assert is_wikidump("\ufeff<mediawiki>".encode("utf-16-be"))
    assert not is_wikidump(b'<doc id="12" url="x" title="Anarchism">\nAnarchism\n</doc>\n')
    assert not is_wikidump(b"<mediawikix>")
    assert not is_wikidump(b"Some text about <mediawiki> markup.")


def test_index_naming(tmp_path):
    dump = tmp_path / "enwiki-20261101-pages-articles-multistream1.xml-p1p41242.bz2"
    index = tmp_path / "enwiki-20261101-pages-articles-multistream-index1.txt-p1p41242.bz2"
    dump.write_bytes(b"")
    assert find_index(str(dump)) is None
    index.write_bytes(b"")
    assert find_index(str(dump)) == str(index)
    assert find_index(str(SINGLE)) is None
    assert find_index(str(MULTI_INDEX)) is None


def test_not_a_dump_is_refused(tmp_path):
    path = tmp_path / "notes.xml"
    path.write_text("<doc id='1'>text</doc>\n")
    with pytest.raises(InputError, match="not a MediaWiki XML dump"):
        split_dump(str(path), 1000)
    gz = tmp_path / "enwiki-pages-articles.xml.gz"
    gz.write_bytes(b"")
    with pytest.raises(InputError, match="use the bz2 dump"):
        split_dump(str(gz), 1000)


# --------------------------------------------------------------------------- options


def test_headings_and_tables_options():
    plain, _, _ = read_dump(TABLES)
    with_tables, _, _ = read_dump(TABLES, options=WikiOptions(keep_tables=True))
    with_headings, _, _ = read_dump(TABLES, options=WikiOptions(keep_headings=True))
    words = lambda docs: sum(len(s.split()) for d in docs for s in d)  # noqa: E731
    assert words(with_tables) > words(plain) * 1.2
    assert "Germany" in {s for d in with_headings for s in d}  # "==Germany==" of the first page
    assert "Germany" not in {s for d in plain for s in d}
    assert words(with_headings) > words(plain)


_ISBN = re.compile(r"\bISBN[ \t]*[0-9]")
_URL = re.compile(r"https?://|www\.")
_REFERENCE_HEADINGS = ("See also", "Notes", "References", "Further reading", "External links")


def _is_subsequence(part: list[str], whole: list[str]) -> bool:
    rest = iter(whole)
    return all(p in rest for p in part)


@pytest.mark.parametrize("path", [SINGLE, MULTI], ids=["single", "multistream"])
def test_reference_sections_and_citations_are_dropped_unless_kept(path):
    """The sample's 98 articles end in See also, Notes, References, Further reading and External
    links sections: lists of titles, ISBNs and URLs (``http://www.kas.de/…`` became
    ``http : / / www . ka ##s . de``). By default none of it reaches the documents: no such
    heading's section, no paragraph with an ISBN, and only the one bare URL that prose holds
    (``ANSI launched www.StandardsPortal.org``); the documents only lose paragraphs. With
    ``keep_references`` the documents are those of the reader before the sections were dropped
    (counts measured with it: 23,183 paragraphs, 169 with an ISBN, 7 with a URL)."""
    docs, stats, _ = read_dump(path)
    kept, kept_stats, _ = read_dump(path, options=WikiOptions(keep_references=True))
    headed, _, _ = read_dump(path, options=WikiOptions(keep_headings=True))
    kept_headed, _, _ = read_dump(path, options=WikiOptions(keep_headings=True, keep_references=True))
    paragraphs = [p for d in docs for p in d]
    kept_paragraphs = [p for d in kept for p in d]
    assert len(docs) == len(kept) == SAMPLE_ARTICLES
    assert dict(stats.documents_skipped) == dict(kept_stats.documents_skipped) == SAMPLE_SKIPS
    assert (len(paragraphs), len(kept_paragraphs)) == (21_104, 23_183)
    with_isbn = lambda paragraphs: sum(bool(_ISBN.search(p)) for p in paragraphs)  # noqa: E731
    assert (with_isbn(paragraphs), with_isbn(kept_paragraphs)) == (0, 169)
    urls = [p for p in paragraphs if _URL.search(p)]
    assert len(urls) == 1 and urls[0].startswith("In 2006, ANSI launched www.StandardsPortal.org")
    assert sum(bool(_URL.search(p)) for p in kept_paragraphs) == 7
    assert not any("www.kas.de" in p for p in paragraphs)
    assert sum("www.kas.de" in p for p in kept_paragraphs) == 2  # Politics of Angola's Further reading
    headings = [p for d in headed for p in d]
    kept_headings = [p for d in kept_headed for p in d]
    assert [headings.count(h) for h in _REFERENCE_HEADINGS] == [0, 0, 0, 0, 0]
    assert [kept_headings.count(h) for h in _REFERENCE_HEADINGS] == [72, 37, 93, 40, 85]
    assert all(_is_subsequence(d, k) for d, k in zip(docs, kept))


def test_export_without_ns_and_redirect_elements(tmp_path):
    """Exports older than schema 0.5 have no ``<ns>`` and no ``<redirect>``: the namespace
    comes from the title prefix (named in ``<siteinfo>``), a redirect from its text."""
    page = "<page><title>{}</title><revision><text>{}</text></revision></page>\n"
    xml = (
        '<mediawiki><siteinfo><namespaces><namespace key="0" />'
        '<namespace key="4">Wikipedia</namespace></namespaces></siteinfo>\n'
        + page.format("A", "#REDIRECT [[B]]")
        + page.format("Wikipedia:About", "About the project.")
        + page.format("B", "'''B''' is a letter.")
        + "</mediawiki>\n"
    )
    path = tmp_path / "old-export.xml"
    path.write_text(xml)
    docs, stats, _ = read_dump(path)
    assert docs == [["B is a letter."]]
    assert dict(stats.documents_skipped) == {"redirect": 1, "namespace": 1}


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("cut", [10, 4, 600_000])
def test_truncated_single_stream_names_file_and_offset(tmp_path, cut):
    data = SINGLE.read_bytes()
    path = tmp_path / "enwiki-cut-pages-articles.xml.bz2"
    path.write_bytes(data[:-cut] if cut < 100 else data[:cut])
    message = r"enwiki-cut-pages-articles\.xml\.bz2: truncated bz2 data.*compressed byte offset \d+"
    with pytest.raises(InputError, match=message):
        read_dump(path, 10**9)


def test_truncated_multistream_fails_only_the_last_piece(tmp_path, whole_sample):
    path = tmp_path / "enwiki-cut-pages-articles-multistream.xml.bz2"
    path.write_bytes(MULTI.read_bytes()[:-2000])
    shutil.copyfile(MULTI_INDEX, tmp_path / "enwiki-cut-pages-articles-multistream-index.txt.bz2")
    pieces = split_dump(str(path), 1)
    assert len(pieces) == 5
    stats = ReadStats()
    docs = []
    for start, end, meta in pieces[:-1]:  # the other pieces complete
        docs.extend(read_dump_piece(str(path), start, end, meta, WikiOptions(), stats))
    assert docs == whole_sample[0][: len(docs)] and len(docs) > 80
    start, end, meta = pieces[-1]
    with pytest.raises(InputError, match=r"truncated bz2 data.*compressed byte offset 1618063"):
        list(read_dump_piece(str(path), start, end, meta, WikiOptions(), ReadStats()))


def test_corrupt_block_names_the_offsets(tmp_path):
    data = bytearray(SINGLE.read_bytes())
    data[500_000] ^= 0x40
    path = tmp_path / "enwiki-bad-pages-articles.xml.bz2"
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"enwiki-bad.*corrupt bz2 data between compressed byte offsets"):
        read_dump(path, 10**9)
    with pytest.raises(InputError, match="corrupt bz2 data"):
        read_dump(path, 300_000)  # the piece whose blocks run through byte 500000 fails


def test_truncated_plain_xml(tmp_path, plain_xml):
    path = tmp_path / "cut.xml"
    path.write_bytes(plain_xml.read_bytes()[:3_000_000])
    with pytest.raises(InputError, match="ends inside a page"):
        read_dump(path, 10**9)


def test_read_errors_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        split_dump(str(tmp_path / "missing.xml.bz2"), 10)
    bad = tmp_path / "x.xml.bz2"
    bad.write_bytes(b"BZh9" + bytes(100))
    with pytest.raises(InputError):
        split_dump(str(bad), 10)


def test_decode_error_policies(tmp_path):
    xml = bz2.decompress(TABLES.read_bytes())
    first = xml.index(b"confidence''' (in")
    broken = xml[:first] + b"\xff" + xml[first:]
    path = tmp_path / "broken.xml"
    path.write_bytes(broken)
    docs, stats, _ = read_dump(path)
    assert len(docs) == 5 and stats.documents_with_replaced_bytes == 1
    docs, stats, _ = read_dump(path, options=WikiOptions(on_decode_error="skip"))
    assert len(docs) == 4 and dict(stats.documents_skipped) == {"invalid_utf8": 1}
    with pytest.raises(InputError, match="invalid utf-8"):
        read_dump(path, options=WikiOptions(on_decode_error="fail"))


def test_abandoned_reader_does_not_abort_the_interpreter(tmp_path):
    """A reader generator left open at exit (a task that failed mid-piece) must not take the
    process down: indexed_bzip2's decoder thread aborts Python's finalization if still open."""
    script = (
        "from mlm_pipeline.read.wikidump import WikiOptions, read_dump_piece, split_dump\n"
        "from mlm_pipeline.stats import ReadStats\n"
        f"url = {str(MULTI)!r}\n"
        "(start, end, meta), *_ = split_dump(url, 10**9)\n"
        "docs = read_dump_piece(url, start, end, meta, WikiOptions(), ReadStats())\n"
        "next(docs)\n"
        "print('read one')\n"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": src},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "read one\n" and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- damaged pages


def test_a_page_over_the_cap_is_read_up_to_it_at_a_line_end(whole_sample, plain_xml):
    """Pages cut at a cap of 100 KB: every page still counted once, the cut ones in ``pages_cut``,
    each cut article read from its start (its first paragraphs as whole), whatever the pieces."""
    full_docs, _, _ = whole_sample
    xml = bz2.decompress(SINGLE.read_bytes())
    pages = list(owned_pages(iter([(xml, True)]), "utf-8"))
    big = [p for p in pages if len(p) > 100_000]  # (the XML of the page, escapes included)
    for target in (10**12, 700_000):
        docs, stats, _ = read_dump(plain_xml, target, options=WikiOptions(max_page_bytes=100_000))
        assert stats.documents_read + sum(stats.documents_skipped.values()) == 206
        assert dict(stats.documents_skipped) == SAMPLE_SKIPS
        assert stats.pages_cut == len(big) == 21
        assert len(docs) == len(full_docs)
        for doc, full in zip(docs, full_docs):
            assert doc == full or (doc[:3] == full[:3] and len(doc) <= len(full))


def test_an_unclosed_page_in_a_utf16_dump_is_counted_and_the_next_read():
    """The missing ``</page>`` found in UTF-16 too (its tags are found at character offsets)."""
    data = bz2.decompress(BGWIKI.read_bytes())
    close = "</page>".encode("utf-16-le")
    first = data.index(close)
    assert first % 2 == 0
    stats = ReadStats()
    pages = list(owned_pages(iter([(data[:first] + data[first + len(close):], True)]), "utf-16-le",
                             report=lambda problem, at, head: stats.skip(problem)))
    assert len(pages) == 2 and dict(stats.documents_skipped) == {"unclosed": 1}
    assert [parse_page(p.decode("utf-16-le")).title for p in pages] == [
        parse_page(p.decode("utf-16-le")).title for p in owned_pages(iter([(data, True)]), "utf-16-le")][1:]


def test_a_multistream_dump_cut_short_is_planned_as_the_whole_dump(tmp_path):
    """The pieces come from the index, not from the file's size: once the file is whole, the
    same tasks."""
    whole = split_dump(str(MULTI), 300_000, index_url=str(MULTI_INDEX))
    short = tmp_path / MULTI.name
    short.write_bytes(MULTI.read_bytes()[:1_100_000])
    assert split_dump(str(short), 300_000, index_url=str(MULTI_INDEX)) == whole
    stats = ReadStats()
    with pytest.raises(InputError, match="truncated: the file ends at byte 1100000, before the bz2 stream at byte "
                                         "1618059 that .*index.txt.bz2 lists"):
        list(read_dump_piece(str(short), *whole[-1], WikiOptions(), stats, index_url=str(MULTI_INDEX)))
