import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mlm_pipeline.errors import InputError
from mlm_pipeline.read import Piece, ReadOptions

from .helpers import read_pieces, read_whole, split_file


@pytest.fixture(scope="module")
def texts(sample_dir):
    raw = (sample_dir / "wikiextractor-AA.txt").read_text(encoding="utf-8")
    paras = [p for p in raw.split("\n") if p.strip() and not p.startswith("<")]
    return ["\n".join(paras[i : i + 5]) for i in range(0, 1000, 5)]  # 200 documents


@pytest.fixture
def parquet_file(tmp_path, texts):
    path = tmp_path / "docs.parquet"
    table = pa.table({"id": list(range(len(texts))), "text": texts})
    pq.write_table(table, path, row_group_size=20)  # 10 row groups
    return path


def test_reads_every_row_as_a_document(parquet_file, texts):
    docs, stats = read_whole(parquet_file, "parquet")
    assert len(docs) == len(texts) == 200
    assert stats.documents_read == 200
    assert not stats.documents_skipped
    assert docs[0][:2] == ["Anarchism", (
        "Anarchism is an anti-authoritarian political and social philosophy that rejects "
        "hierarchies deemed unjust and advocates their replacement with self-managed, "
        "self-governed societies based on voluntary, cooperative institutions."
    )]
    meta = pq.read_metadata(parquet_file)
    assert stats.bytes_read == sum(
        meta.row_group(i).column(1).total_compressed_size for i in range(meta.num_row_groups)
    )


def test_split_into_row_group_runs(parquet_file):
    meta = pq.read_metadata(parquet_file)
    sizes = [
        sum(meta.row_group(i).column(j).total_compressed_size for j in range(2))
        for i in range(meta.num_row_groups)
    ]
    split = sizes[0] * 3 + 1
    pieces = split_file(str(parquet_file), "parquet", 0, split)
    assert 1 < len(pieces) < 10
    assert pieces[0].start == 0 and pieces[-1].end == 10
    assert all(a.end == b.start for a, b in zip(pieces, pieces[1:]))
    for p in pieces:
        assert p.end - p.start == 1 or sum(sizes[p.start : p.end]) <= split
    whole, whole_stats = read_whole(parquet_file, "parquet")
    docs, stats = read_pieces(pieces)
    assert docs == whole
    assert stats.to_dict() == whole_stats.to_dict()
    assert split_file(str(parquet_file), "parquet", 0, 1 << 40) == [
        Piece(str(parquet_file), "parquet", 0, None)
    ]


def test_missing_or_wrong_column_names_what_is_there(parquet_file):
    with pytest.raises(InputError, match=r"no column 'body'; columns: id, text"):
        read_whole(parquet_file, "parquet", ReadOptions(text_field="body"))
    with pytest.raises(InputError, match=r"column 'id' has type int64"):
        read_whole(parquet_file, "parquet", ReadOptions(text_field="id"))


def test_nulls_empties_nul_and_invalid_utf8(tmp_path):
    values = [b"Good. Two.", None, b"   ", b"a\x00b", b"bad \xff byte.", b"Last."]
    path = tmp_path / "b.parquet"
    pq.write_table(pa.table({"body": pa.array(values, pa.binary())}), path)
    opts = ReadOptions(text_field="body")
    docs, stats = read_whole(path, "parquet", opts)
    assert docs == [["Good.", "Two."], ["bad \ufffd byte."], ["Last."]]
    assert stats.documents_skipped == {"bad_record": 1, "empty": 1, "binary": 1}
    assert stats.documents_with_replaced_bytes == 1
    skip = ReadOptions(text_field="body", on_decode_error="skip")
    docs, stats = read_whole(path, "parquet", skip)
    assert docs == [["Good.", "Two."], ["Last."]]
    assert stats.documents_skipped["invalid_utf8"] == 1
    with pytest.raises(InputError, match=r"b\.parquet: invalid UTF-8 in column 'body', row 4"):
        read_whole(path, "parquet", ReadOptions(text_field="body", on_decode_error="fail"))


def test_large_string_and_empty_file(tmp_path):
    path = tmp_path / "l.parquet"
    column = pa.array(["Alpha is. Beta is.", "C"], pa.large_string())
    pq.write_table(pa.table({"text": column}), path)
    assert read_whole(path, "parquet")[0] == [["Alpha is.", "Beta is."], ["C"]]
    empty = tmp_path / "e.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), empty)
    docs, stats = read_whole(empty, "parquet")
    assert docs == [] and stats.documents_read == 0
    assert len(split_file(str(empty), "parquet", 0, 100)) == 1


def test_row_group_range_beyond_file_is_an_error(parquet_file):
    with pytest.raises(InputError, match=r"\[row groups 5:11\]: the file has only 10 row groups"):
        read_whole(parquet_file, "parquet", start=5, end=11)


def test_a_missing_column_stops_the_run_before_the_output_is_recorded(parquet_file, tmp_path):
    """Planning reads the footer anyway: the column is checked there, so a failed start leaves
    no run behind that a corrected rerun would have to match."""
    from conftest import VOCAB
    from mlm_pipeline.config import build_config
    from mlm_pipeline.pipeline import run_prepare

    out = tmp_path / "out"
    config = build_config({"inputs": [str(parquet_file)], "output": str(out), "tokenizer": str(VOCAB),
                           "text_field": "body", "progress": False})
    with pytest.raises(InputError, match=r"no column 'body'; columns: id, text"):
        run_prepare(config, show_progress=False)
    assert not (out / "_run.json").exists()
