import re

import blingfire

from mlm_pipeline.read.sentences import (
    PARAGRAPH_SEPARATOR,
    paragraphs_of,
    segment_documents,
    split_sentences,
)
from mlm_pipeline.stats import ReadStats


def test_abbreviations_do_not_end_sentences():
    assert split_sentences(["Mr. Jones went to Washington. He arrived at 5 p.m. yesterday."]) == [
        ["Mr. Jones went to Washington.", "He arrived at 5 p.m. yesterday."]
    ]
    assert split_sentences(["Dr. Smith met Mrs. Brown at 10 a.m. on Jan. 5. They talked."]) == [
        ["Dr. Smith met Mrs. Brown at 10 a.m. on Jan. 5.", "They talked."]
    ]


def test_paragraph_boundaries_are_kept_in_one_batch():
    paragraphs = ["A paragraph without a final stop", "Mr.", "Next one. Two sentences.", "  ", ""]
    assert split_sentences(paragraphs) == [
        ["A paragraph without a final stop"],
        ["Mr."],
        ["Next one.", "Two sentences."],
        [],
        [],
    ]


def test_separator_inside_a_paragraph_falls_back_without_losing_text():
    paragraphs = [f"First part{PARAGRAPH_SEPARATOR}second part.", "Other. Text."]
    assert split_sentences(paragraphs) == [["First part", "second part."], ["Other.", "Text."]]


def test_paragraphs_come_out_as_when_segmented_alone(sample_dir):
    """One call for a document's paragraphs cuts each paragraph as a call for it alone does."""
    paragraphs = []
    for name in ("wikitext2-train-1MB.txt", "wikiextractor-AA.txt"):
        text = (sample_dir / name).read_text(encoding="utf-8")
        paragraphs += [p for p in paragraphs_of(text) if not p.startswith("<doc")]
    alone = [split_sentences([p])[0] for p in paragraphs]
    batched = []
    for i in range(0, len(paragraphs), 20):
        batched += split_sentences(paragraphs[i : i + 20])
    assert batched == alone
    assert split_sentences(paragraphs[:300][::-1]) == alone[:300][::-1]
    # the cases that shaped the joiner: blingfire on its own cuts these
    assert blingfire.text_to_sentences('or both . ""') == 'or both .\n""'
    assert split_sentences(['or both . ""', "Next ."]) == [['or both . ""'], ["Next ."]]
    assert split_sentences(["Fine .", "Dr. Ruy went home ."]) == [
        ["Fine ."],
        ["Dr. Ruy went home ."],
    ]


def test_cjk_full_width_stops_and_closing_quotes(data_dir):
    text = (data_dir / "hongloumeng-300KB.txt").read_text(encoding="utf-8")
    paragraphs = paragraphs_of(text)[:60]
    result = split_sentences(paragraphs)
    # every non-space character is kept, in order, in the right paragraph
    for para, sents in zip(paragraphs, result):
        assert re.sub(r"\s", "", "".join(sents)) == re.sub(r"\s", "", para)
    sentences = [s for sents in result for s in sents]
    assert len(sentences) > 3 * len(paragraphs)
    assert not any(s[0] in "”’」』" for s in sentences)
    assert split_sentences(["黛玉道：“你去罢。”宝玉听了。然后走了！好吗？"]) == [
        ["黛玉道：“你去罢。”", "宝玉听了。", "然后走了！", "好吗？"]
    ]
    assert sentences[1] == "此开卷第一回也。"


def test_segment_documents_counts():
    docs = [(["One. Two."], False), (["   "], False), (["Three", "Four."], True)] * 50
    stats = ReadStats()
    out = list(segment_documents(iter(docs), stats))
    assert out == [["One.", "Two."], ["Three", "Four."]] * 50
    assert stats.documents_read == 100
    assert stats.sentences == 200
    assert stats.documents_skipped == {"empty": 50}
    assert stats.documents_with_replaced_bytes == 50


def test_a_document_over_the_call_limit_is_segmented_in_bounded_calls(sample_dir, monkeypatch):
    """Paragraphs under SEGMENT_CHARS come out as alone; a longer one is segmented in pieces of
    at most that size, with every non-space character kept in order."""
    from mlm_pipeline.read import sentences

    text = (sample_dir / "wikitext2-train-1MB.txt").read_text(encoding="utf-8")
    paragraphs = paragraphs_of(text)[:400]
    alone = [split_sentences([p])[0] for p in paragraphs]
    long_paragraph = " ".join(paragraphs[:40])
    whole = split_sentences([long_paragraph])[0]
    calls = []
    segment = sentences._text_to_sentences
    monkeypatch.setattr(sentences, "_text_to_sentences", lambda t: calls.append(len(t)) or segment(t))
    monkeypatch.setattr(sentences, "SEGMENT_CHARS", 3000)
    assert max(map(len, paragraphs)) < 3000 < len(long_paragraph)
    got = split_sentences([*paragraphs, long_paragraph, *paragraphs[:5]])
    assert max(calls) <= 3000
    assert got[:400] == alone and got[401:] == alone[:5]
    assert re.sub(r"\s", "", "".join(got[400])) == re.sub(r"\s", "", long_paragraph)
    # the pieces end at sentence ends where there are some: nearly all sentences are those of one call
    assert len(set(got[400]) & set(whole)) > 0.9 * len(whole)
