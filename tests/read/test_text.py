import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlm_pipeline.read import ReadOptions, ranges
from mlm_pipeline.read import text as text_reader
from mlm_pipeline.read.ranges import is_blank

from conftest import DATA

from .helpers import read_cuts, read_whole, text_oracle


def test_sample_text_documents(sample_dir):
    path = sample_dir / "sample_text.txt"
    docs, stats = read_whole(path, "text")
    # the file has 3 blank-line-separated documents and 31 non-blank lines
    assert len(docs) == 3
    assert [len(d) for d in docs] == [3, 13, 15]
    assert docs[0][0] == (
        "This text is included to make sure Unicode is handled properly: 力加勝北区ᴵᴺᵀᵃছজটডণত"
    )
    assert docs[1][0].startswith("The rain had only ceased with the gray streaks of morning")
    assert stats.documents_read == 3
    assert stats.sentences == 31
    assert stats.bytes_read == path.stat().st_size
    assert not stats.documents_skipped
    assert docs == text_oracle(path.read_text(encoding="utf-8"))


def test_wikitext_matches_reference_reading(sample_dir):
    path = sample_dir / "wikitext2-train-1MB.txt"
    docs, stats = read_whole(path, "text")
    expected = text_oracle(path.read_text(encoding="utf-8"))
    assert docs == expected
    assert len(docs) > 1000
    assert docs[0] == ["= 2013 – 14 York City F.C. season ="]  # headings are their own document
    assert stats.bytes_read == path.stat().st_size


def test_crlf_line_endings_read_like_lf(sample_dir, tmp_path):
    data = (sample_dir / "sample_text.txt").read_bytes()
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(data.replace(b"\n", b"\r\n"))
    assert read_whole(crlf, "text")[0] == read_whole(sample_dir / "sample_text.txt", "text")[0]


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"\n\n  \na\nb\n\n\n\nc\n", [["a", "b"], ["c"]]),  # leading blank lines, runs of blanks
        (b"a\n \t\r\nb", [["a"], ["b"]]),  # whitespace-only separator, no final newline
        (b"  a  \n\tb\t\n", [["a", "b"]]),  # lines are stripped
        ("a\n\u3000\u00a0\nb\n".encode(), [["a"], ["b"]]),  # Unicode whitespace is blank too
        ("\ufeffa\nb\n".encode(), [["a", "b"]]),  # a byte-order mark is dropped
        (b"\n \n\n", []),  # only blank lines: no document
        (b"a\x0cb\n", [["a\x0cb"]]),  # only \n ends a line
    ],
)
def test_small_files(tmp_path, data, expected):
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    docs, stats = read_whole(path, "text")
    assert docs == expected
    assert stats.documents_read == len(expected)
    assert stats.bytes_read == len(data)
    assert not stats.documents_skipped


def test_document_without_separators_is_emitted_in_bounded_parts(tmp_path):
    lines = [f"sentence number {i} of a file with no blank line." for i in range(2000)]
    path = tmp_path / "one-doc.txt"
    path.write_text("\n".join(lines) + "\n")
    docs, stats = read_whole(path, "text", ReadOptions(max_document_bytes=10_000))
    assert len(docs) > 5
    assert [s for d in docs for s in d] == lines  # nothing lost, order kept
    assert all(sum(len(s) + 1 for s in d) <= 10_000 for d in docs)
    assert stats.documents_read == len(docs)
    # the default limit keeps it as one document, as the reference does
    assert read_whole(path, "text")[0] == [lines]


def test_sentence_split_for_paragraph_per_line_text(tmp_path, caplog):
    """WikiText (a paragraph per line, blank lines between): without --sentence-split each
    paragraph is one sentence of a one-sentence document, the planner warns and the report flags
    the random-next share; with it, lines are split by the segmenter and the share falls under the
    flag (above half: headings and one-sentence paragraphs stay one-sentence documents)."""
    import logging

    from conftest import VOCAB, WIKITEXT
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.pipeline import run_prepare
    from mlm_pipeline.read.sentences import split_sentences
    from mlm_pipeline.report import render_report

    text = WIKITEXT.read_bytes()[:200_000]
    corpus = tmp_path / "wiki.txt"
    corpus.write_bytes(text[: text.rindex(b"\n") + 1])

    def run(name, **kw):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
            manifest = run_prepare(PrepareConfig(inputs=[str(corpus)], output=str(tmp_path / name),
                                                 tokenizer=str(VOCAB), workers=1, progress=False, **kw))
        warned = [r.getMessage() for r in caplog.records if "paragraph per line" in r.getMessage()]
        return manifest, warned

    lines, warned = run("lines")
    split, quiet = run("split", sentence_split=True)
    electra_run, electra = run("electra", objective="electra")  # no pairs, but long lines lose their tails
    _, packed = run("packed", objective="packed")  # packing cuts long sentences across instances: nothing lost
    share = lines["totals"]["random_next"] / lines["totals"]["instances"]
    split_share = split["totals"]["random_next"] / split["totals"]["instances"]
    assert share > 0.85 and 0.5 < split_share < 0.7, (share, split_share)
    assert warned and "--sentence-split" in warned[0] and str(corpus) in warned[0] and not quiet and not packed
    assert "most pairs would be random-next" in warned[0]
    assert electra and "past what fits in an example would be dropped: --sentence-split" in electra[0]
    assert "of the tokens read" in render_report(electra_run) and "--sentence-split" in render_report(electra_run)
    assert "random-next (over 70%)" in render_report(lines) and "--sentence-split" in render_report(lines)
    assert "random-next (over 70%)" not in render_report(split) and "--sentence-split" not in render_report(split)
    # the sentences are the segmenter's, line by line
    paragraphs = [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert lines["totals"]["sentences"] == len(paragraphs)
    assert split["totals"]["sentences"] == sum(len(s) for s in split_sentences(paragraphs)) > 3 * len(paragraphs)


# --------------------------------------------------------------------------- runs read in bulk

BULK_BITS = [b"a", b"bc. d", b" ", b"\t", b"\r", b"\r\n", b"\n", b"\n", b"\n", b"\n \n", b"\xc3\xa9",
             "\u3000\u00a0\u2028".encode(), b"\x1c", b"\xff", b"\x00", b"long-long-long-line", b"\xef\xbb\xbf"]


def _line_by_line(monkeypatch):
    """Read with every run taken line by line (the bulk path refused)."""
    monkeypatch.setattr(text_reader, "_stripped_run", lambda lines: None)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_runs_read_in_bulk_give_what_line_by_line_gives(tmp_path, data):
    """Runs decoded and stripped in bulk give the documents and counts of the line-by-line steps,
    whatever the chunking, cuts and limits (runs with invalid UTF-8, NUL, over-long lines, the
    range's end or large documents in them are read line by line)."""
    raw = b"".join(data.draw(st.lists(st.sampled_from(BULK_BITS), max_size=200)))
    path = tmp_path / "bulk.txt"
    path.write_bytes(raw)
    cuts = data.draw(st.lists(st.integers(1, max(1, len(raw) - 1)), max_size=6))
    options = ReadOptions(max_line_bytes=data.draw(st.sampled_from([12, 1 << 20])),
                          max_document_bytes=data.draw(st.sampled_from([30, 200, 64 << 20])))
    chunk = data.draw(st.integers(8, 256))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ranges, "CHUNK_BYTES", chunk)
        bulk = read_cuts(path, "text", cuts, options)
        _line_by_line(mp)
        one_by_one = read_cuts(path, "text", cuts, options)
    assert bulk[0] == one_by_one[0]
    assert bulk[1].to_dict() == one_by_one[1].to_dict()


@pytest.mark.parametrize("name", ["wikitext2-train-1MB.txt", "hongloumeng-300KB.txt"])
def test_real_text_is_read_in_bulk(sample_dir, monkeypatch, name):
    """Real text cut into three ranges (WikiText: paragraphs between blank lines; the Chinese
    novel: no blank line at all, one document) has nearly every line read in bulk, with the
    documents and counts of the line-by-line steps."""
    path = sample_dir / name if (sample_dir / name).exists() else DATA / name
    cuts = [len(path.read_bytes()) * 3 // 10, len(path.read_bytes()) * 2 // 3]
    in_bulk = []
    bulk_split = text_reader._stripped_run

    def counted(lines):
        decoded = bulk_split(lines)
        if decoded is not None:
            in_bulk.append(len(lines))
        return decoded

    monkeypatch.setattr(text_reader, "_stripped_run", counted)
    bulk = read_cuts(path, "text", cuts)
    assert sum(in_bulk) > 0.95 * path.read_bytes().count(b"\n")
    _line_by_line(monkeypatch)
    one_by_one = read_cuts(path, "text", cuts)
    assert bulk[0] == one_by_one[0] == text_oracle(path.read_text(encoding="utf-8"))
    assert bulk[1].to_dict() == one_by_one[1].to_dict()


def test_a_text_without_blank_lines_is_cut_in_bulk(monkeypatch):
    """A novel without blank lines, read with a small document limit, is cut into parts of at
    most that size a stretch at a time (no line-by-line step for its lines), with the parts,
    cuts and counts of the line-by-line steps."""
    path = DATA / "hongloumeng-300KB.txt"
    lines = path.read_bytes().count(b"\n")
    options = ReadOptions(max_document_bytes=20_000)
    stepped = []
    monkeypatch.setattr(text_reader, "is_blank", lambda line, too_long=False: stepped.append(line) or is_blank(line, too_long))
    docs, stats = read_cuts(path, "text", [], options)
    assert len(stepped) < 0.02 * lines, (len(stepped), lines)
    assert stats.documents_cut == len(docs) - 1 > 10
    assert all(len("\n".join(d).encode()) + 1 <= 20_000 for d in docs)
    _line_by_line(monkeypatch)
    assert read_cuts(path, "text", [], options)[0] == docs
