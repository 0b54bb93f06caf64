import json

import pytest

from mlm_pipeline.errors import InputError
from mlm_pipeline.read import ReadOptions
from mlm_pipeline.read.sentences import split_sentences

from .helpers import read_whole


def _write(path, lines):
    path.write_bytes(b"".join(line if isinstance(line, bytes) else line.encode() for line in lines))
    return path


def test_records_from_sample_documents(sample_dir, tmp_path):
    docs, _ = read_whole(sample_dir / "sample_text.txt", "text")
    path = _write(
        tmp_path / "s.jsonl",
        [
            json.dumps({"id": i, "text": "\n".join(d)}, ensure_ascii=False) + "\n"
            for i, d in enumerate(docs)
        ],
    )
    got, stats = read_whole(path, "jsonl")
    # each line is a paragraph, segmented on its own
    assert got == [[s for sents in split_sentences(d) for s in sents] for d in docs]
    assert len(got) == 3
    assert got[0] == docs[0]
    assert all(len(g) >= len(d) for g, d in zip(got, docs))
    assert stats.documents_read == 3
    assert stats.sentences == sum(map(len, got)) > 31
    assert stats.bytes_read == path.stat().st_size


def test_paragraphs_then_sentences(tmp_path):
    text = "Mr. Smith went home. He slept.\r\n\r\nSecond paragraph without stop\u2029Third. End."
    path = _write(tmp_path / "p.jsonl", [json.dumps({"text": text}) + "\n"])
    assert read_whole(path, "jsonl")[0] == [
        ["Mr. Smith went home.", "He slept.", "Second paragraph without stop", "Third.", "End."]
    ]


def test_bad_records_are_counted_by_reason(tmp_path):
    path = _write(
        tmp_path / "bad.jsonl",
        [
            '{"text": "Good one."}\n',
            "[1, 2]\n",  # not an object
            "not json at all\n",
            '{"text": 3}\n',  # not a string
            '{"body": "x"}\n',  # missing field
            '{"text": null}\n',
            '{"text": "   \\n\\t "}\n',  # whitespace only
            '{"text": ""}\n',
            "\n",  # blank lines are not records
            "   \n",
            '{"text": "a\\u0000b"}\n',  # NUL through an escape
            b'{"text": "a\x00b"}\n',  # raw NUL
            '{"text": "Last one."}',  # no final newline
        ],
    )
    docs, stats = read_whole(path, "jsonl")
    assert docs == [["Good one."], ["Last one."]]
    assert stats.documents_skipped == {"bad_record": 5, "empty": 2, "binary": 2}
    assert stats.documents_read == 2
    assert stats.bytes_read == path.stat().st_size


def test_text_field_option(tmp_path):
    path = _write(tmp_path / "f.jsonl", ['{"text": "no.", "content": "Yes. Here."}\n'])
    assert read_whole(path, "jsonl", ReadOptions(text_field="content"))[0] == [["Yes.", "Here."]]


@pytest.mark.parametrize(
    "policy, docs, skipped, replaced",
    [
        ("replace", [["A\ufffdb."], ["Ok."]], {}, 1),
        ("skip", [["Ok."]], {"invalid_utf8": 1}, 0),
    ],
)
def test_lone_surrogate_escapes_follow_decode_policy(tmp_path, policy, docs, skipped, replaced):
    path = _write(tmp_path / "s.jsonl", ['{"text": "A\\ud800b."}\n', '{"text": "Ok."}\n'])
    got, stats = read_whole(path, "jsonl", ReadOptions(on_decode_error=policy))
    assert got == docs
    assert stats.documents_skipped == skipped
    assert stats.documents_with_replaced_bytes == replaced


def test_lone_surrogate_fail_names_the_record(tmp_path):
    path = _write(tmp_path / "s.jsonl", ['{"text": "Ok."}\n', '{"text": "A\\udc00"}\n'])
    with pytest.raises(InputError, match=r"s\.jsonl.*offset 16"):
        read_whole(path, "jsonl", ReadOptions(on_decode_error="fail"))


def test_valid_surrogate_pair_is_text(tmp_path):
    path = _write(tmp_path / "s.jsonl", ['{"text": "Smile \\ud83d\\ude00."}\n'])
    docs, stats = read_whole(path, "jsonl", ReadOptions(on_decode_error="fail"))
    assert docs == [["Smile \U0001f600."]]
    assert stats.documents_with_replaced_bytes == 0
