import re

from .helpers import read_whole

HEADER = '<doc id="{i}" url="https://en.wikipedia.org/wiki?curid={i}" title="{t}">\n'


def _articles(raw: str):
    """(title, paragraphs) per article, parsed independently with a regex."""
    out = []
    for m in re.finditer(r'<doc [^\n]*title="([^\n]*)">\n(.*?)\n</doc>', raw, re.S):
        paras = [p.strip() for p in m.group(2).split("\n") if p.strip()]
        if paras and paras[0] == m.group(1):
            paras = paras[1:]
        out.append((m.group(1), paras))
    return out


def test_sample_has_37_articles_without_title_lines(sample_dir):
    path = sample_dir / "wikiextractor-AA.txt"
    raw = path.read_text(encoding="utf-8")
    docs, stats = read_whole(path, "wikiextractor")
    articles = _articles(raw)
    assert len(articles) == 37
    assert len(docs) == 37
    assert stats.documents_read == 37
    assert not stats.documents_skipped
    assert stats.bytes_read == path.stat().st_size
    assert stats.sentences == sum(map(len, docs))
    assert docs[0][0] == (
        "Anarchism is an anti-authoritarian political and social philosophy that rejects "
        "hierarchies deemed unjust and advocates their replacement with self-managed, "
        "self-governed societies based on voluntary, cooperative institutions."
    )
    for doc, (title, paras) in zip(docs, articles):
        assert doc[0] != title
        # sentences are the paragraphs' text, cut up, nothing lost or added
        assert re.sub(r"\s", "", "".join(doc)) == re.sub(r"\s", "", "".join(paras))
        assert len(doc) >= len(paras)


def test_malformed_blocks_and_stray_text(tmp_path):
    raw = (
        "stray before\nmore stray\n\n"
        + HEADER.format(i=1, t="One")
        + "One\n\nFirst para. Second sentence.\n</doc>\n"
        + "stray between\n"
        + HEADER.format(i=2, t="Title only")
        + "Title only\n\n</doc>\n"
        + HEADER.format(i=3, t="Empty")
        + "</doc>\n"
        + HEADER.format(i=4, t="No close")
        + "Unclosed text.\n"
        + HEADER.format(i=5, t="Last")
        + "Last\nTail without end tag"
    )
    path = tmp_path / "wiki.txt"
    path.write_text(raw)
    docs, stats = read_whole(path, "wikiextractor")
    assert docs == [
        ["First para.", "Second sentence."],
        ["Unclosed text."],
        ["Tail without end tag"],
    ]
    assert stats.documents_skipped == {"outside_doc": 2, "empty": 2}
    assert stats.bytes_read == len(raw.encode())


def test_title_line_dropped_only_when_it_matches(tmp_path):
    path = tmp_path / "wiki.txt"
    path.write_text(
        HEADER.format(i=1, t="Alpha")
        + "Not the title.\nAlpha\n</doc>\n"
        + '<doc id="2" title="Tom &amp; &quot;Jerry&quot;" url="x">\nTom & "Jerry"\nText.\n</doc>\n'
    )
    assert read_whole(path, "wikiextractor")[0] == [["Not the title.", "Alpha"], ["Text."]]
