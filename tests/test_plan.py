"""Planning: the task size derived from the input (``--split-size auto``) and what depends on it."""

from __future__ import annotations

import pytest

from conftest import SAMPLE_TEXT, VOCAB, WIKIEXTRACTOR, WIKITEXT
from mlm_pipeline import fs
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.errors import ConfigError, InputError
from mlm_pipeline.plan import auto_split_bytes, plan_tasks
from mlm_pipeline.read import (
    InputFormat,
    Piece,
    ReadOptions,
    iter_documents,
    register_input_format,
    unregister_input_format,
)
from mlm_pipeline.stats import ReadStats

MIB = 1 << 20


@pytest.mark.parametrize(
    "total, expected",
    [
        (0, 4 * MIB),
        (500_000, 4 * MIB),
        (100 * 10**6, 4 * MIB),  # 100 MB: 24 tasks of one processing block each
        (1024 * MIB, 4 * MIB),  # 1 GiB: 256 tasks of 4 MiB
        (1024 * MIB + 1, 5 * MIB),  # rounded up to whole MiB
        (10**9, 4 * MIB),  # 1 GB: 3.73 MiB -> 4 MiB, 239 tasks
        (10 << 30, 40 * MIB),
        (16 << 30, 64 * MIB),
        (500 << 30, 64 * MIB),  # big corpora: 64 MiB tasks
    ],
)
def test_auto_split_bytes(total, expected):
    assert auto_split_bytes(total) == expected


def config(inputs, **kw) -> PrepareConfig:
    return PrepareConfig(inputs=[str(p) for p in inputs], output="unused", tokenizer=str(VOCAB), **kw)


@pytest.fixture(scope="module")
def ten_mb(tmp_path_factory):
    """WikiText-2 (the 1 MB sample) repeated to ~10 MB, sections kept apart by blank lines."""
    path = tmp_path_factory.mktemp("plan") / "ten.txt"
    text = WIKITEXT.read_bytes()
    with open(path, "wb") as f:
        for _ in range(10):
            f.write(text + b"\n\n")
    return path


def test_a_small_corpus_is_cut_in_tasks_of_one_block_by_default(ten_mb):
    plan = plan_tasks(config([ten_mb]))
    size = ten_mb.stat().st_size
    assert plan.split_bytes == 4 * MIB  # the floor: one default processing block
    assert len(plan.tasks) == -(-size // (4 * MIB)) == 3
    assert sum(t.input_bytes for t in plan.tasks) == size
    # the task size, hence the plan, depends on the input only
    assert plan_tasks(config([ten_mb], workers=1)).fingerprint() == plan_tasks(config([ten_mb], workers=7)).fingerprint()


def test_a_set_split_size_wins_over_auto(ten_mb):
    plan = plan_tasks(config([ten_mb], split_bytes="1MiB"))
    assert plan.split_bytes == 1 * MIB and len(plan.tasks) == 10
    assert plan_tasks(config([ten_mb], split_bytes="auto")).split_bytes == 4 * MIB


def test_small_files_are_grouped_up_to_the_auto_size():
    plan = plan_tasks(config([SAMPLE_TEXT, WIKITEXT, WIKIEXTRACTOR]))  # 4 KB, 0.95 MiB, 0.99 MiB
    assert plan.split_bytes == 4 * MIB
    # in URL order: sample_text.txt, wikiextractor-AA.txt, wikitext2-train-1MB.txt, in one task
    assert [[p.url for p in t.pieces] for t in plan.tasks] == [[str(SAMPLE_TEXT), str(WIKIEXTRACTOR), str(WIKITEXT)]]
    # a set size groups them up to it
    plan = plan_tasks(config([SAMPLE_TEXT, WIKITEXT, WIKIEXTRACTOR], split_bytes="1MiB"))
    assert [[p.url for p in t.pieces] for t in plan.tasks] == [[str(SAMPLE_TEXT), str(WIKIEXTRACTOR)], [str(WIKITEXT)]]


def test_tasks_follow_the_files_url_order_whatever_the_input_order(tmp_path):
    """The plan (and so every task's id and seed) does not depend on the order inputs are named
    in; a reference mode keeps that order, as its reference script does."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("One.\nTwo.\n")
    (tmp_path / "b.txt").write_text("Three.\nFour.\n")
    forward = [str(SAMPLE_TEXT), str(tmp_path / "b.txt"), str(tmp_path / "sub")]

    def urls(inputs, **kw):
        plan = plan_tasks(config(inputs, split_bytes=1024, **kw))
        return list(dict.fromkeys(p.url for t in plan.tasks for p in t.pieces)), plan.fingerprint()

    expected = sorted([str(SAMPLE_TEXT), str(tmp_path / "b.txt"), str(tmp_path / "sub" / "a.txt")])
    assert urls(forward)[0] == expected
    assert urls(forward[::-1]) == urls(forward) == urls(forward[1:] + forward[:1])
    assert urls(forward[::-1], reference=True)[0] == [str(tmp_path / "sub" / "a.txt"), str(tmp_path / "b.txt"),
                                                      str(SAMPLE_TEXT)]


def test_the_binary_check_is_the_formats(tmp_path):
    """A Parquet file under a text name is skipped as binary when detected (as text), and read
    when the format is named; a compressed Parquet file is refused by name."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    hidden = tmp_path / "rows.txt"
    pq.write_table(pa.table({"text": ["One sentence.", "Another one."]}), hidden)
    detected = plan_tasks(config([hidden, SAMPLE_TEXT]))
    assert detected.skipped_files == [
        {"path": str(hidden), "reason": "binary", "detail": "binary data; it looks like Parquet (name it *.parquet)"}
    ]
    named = plan_tasks(config([hidden], input_format="parquet"))
    assert named.files == [{"path": str(hidden), "bytes": hidden.stat().st_size, "format": "parquet", "pieces": 1}]
    assert named.tasks[0].describe() == f"{hidden} [row groups 0:end]"
    (tmp_path / "rows.parquet.gz").write_bytes(gzip.compress(hidden.read_bytes()))
    with pytest.raises(InputError, match="compressed Parquet"):
        plan_tasks(config([tmp_path / "rows.parquet.gz"]))


# --------------------------------------------------------------------------- formats with side files


class IndexedDocs(InputFormat):
    """Documents separated by blank lines in ``NAME.docs``, with ``NAME.docs.offsets`` beside
    it listing each document's byte offset: the shape of a multistream dump and its index.
    Pieces are cut exactly at indexed offsets, so a reader needs no resynchronisation."""

    name = "indexed-docs"

    def claims_name(self, sample):
        return sample.extension == ".docs"

    def side_files(self, url, options):
        return (url + ".offsets",)

    def split(self, url, size, split_bytes, options):
        offsets = [int(x) for x in fs.read_bytes(url + ".offsets").split()] + [size]
        pieces, first = [], 0
        for i in range(1, len(offsets)):
            if offsets[i] - offsets[first] >= split_bytes or i == len(offsets) - 1:
                pieces.append(Piece(url, self.name, offsets[first], offsets[i], extra={"documents": i - first}))
                first = i
        return pieces

    def read(self, piece, options, stats):
        with fs.open_url(piece.url) as f:
            f.seek(piece.start)
            data = f.read(piece.end - piece.start)
        stats.bytes_read += len(data)
        docs = [d.split("\n") for d in data.decode().strip("\n").split("\n\n")]
        if len(docs) != piece.extra["documents"]:
            raise InputError(f"{piece.describe()}: the index promised {piece.extra['documents']} documents")
        for doc in docs:
            stats.documents_read += 1
            stats.sentences += len(doc)
            yield doc


@pytest.fixture
def indexed_docs(tmp_path):
    fmt = register_input_format(IndexedDocs())
    docs = [[f"Sentence {i}.{j} of the corpus, which goes on for a while." for j in range(1 + i % 4)]
            for i in range(40)]
    data, offsets = b"", []
    for doc in docs:
        offsets.append(len(data))
        data += ("\n".join(doc) + "\n\n").encode()
    (tmp_path / "corpus.docs").write_bytes(data)
    (tmp_path / "corpus.docs.offsets").write_text("\n".join(map(str, offsets)) + "\n")
    (tmp_path / "other.txt").write_text("A plain text document.\n")
    try:
        yield tmp_path, docs
    finally:
        unregister_input_format(fmt.name)


def test_a_format_splits_by_its_side_file_and_the_side_file_is_not_read_alone(indexed_docs):
    directory, docs = indexed_docs
    plan = plan_tasks(config([directory], split_bytes=1024))
    main, index, other = (str(directory / n) for n in ("corpus.docs", "corpus.docs.offsets", "other.txt"))
    assert [(f["path"], f["format"], f.get("side_files")) for f in plan.files] == [
        (main, "indexed-docs", [index]), (other, "text", None)
    ]
    assert plan.skipped_files == [{"path": index, "reason": "side_file", "detail": f"read with {main}"}]
    pieces = [p for t in plan.tasks for p in t.pieces if p.fmt == "indexed-docs"]
    assert len(pieces) > 3 and sum(p.extra["documents"] for p in pieces) == len(docs)
    # a piece's extra survives the plan's JSON (finalize rebuilds pieces with Piece(**d)) ...
    for task in plan.tasks:
        assert tuple(Piece(**d) for d in task.to_dict()["pieces"]) == task.pieces
    # ... and pieces without one are written as before
    assert "extra" not in plan.tasks[-1].to_dict()["pieces"][-1]
    stats = ReadStats()
    read = [d for p in pieces for d in iter_documents(p, ReadOptions(), stats)]
    assert read == docs and stats.bytes_read == (directory / "corpus.docs").stat().st_size


def test_links_to_directories_are_followed_once_and_what_cannot_be_read_is_counted(tmp_path):
    """A linked subdirectory is read through its link; a loop, a second link to the same
    directory, a link to a file listed already and a broken link are skipped with their reason,
    never stopping the run."""
    import os
    import shutil

    corpus, elsewhere = tmp_path / "corpus", tmp_path / "elsewhere"
    (corpus / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    shutil.copyfile(SAMPLE_TEXT, corpus / "a.txt")
    shutil.copyfile(SAMPLE_TEXT, elsewhere / "b.txt")
    os.symlink(elsewhere, corpus / "linked")
    os.symlink(elsewhere, corpus / "sub" / "linked-again")
    os.symlink("..", corpus / "sub" / "loop")
    os.symlink(tmp_path / "nothing", corpus / "broken")
    os.symlink(corpus / "a.txt", corpus / "sub" / "file-link.txt")

    plan = plan_tasks(PrepareConfig(inputs=[str(corpus)], output=str(tmp_path / "out"), tokenizer=str(VOCAB)))
    assert [f["path"] for f in plan.files] == [str(corpus / "a.txt"), str(corpus / "linked" / "b.txt")]
    reasons = {os.path.relpath(s["path"], corpus): s["reason"] for s in plan.skipped_files}
    assert reasons == {"broken": "unreadable", "sub/linked-again": "directory_link_seen",
                       "sub/loop": "directory_link_seen", "sub/file-link.txt": "file_seen"}
    # a link to the directory given as the input works as the directory itself
    os.symlink(corpus, tmp_path / "corpus-link")
    plan = plan_tasks(PrepareConfig(inputs=[str(tmp_path / "corpus-link")], output=str(tmp_path / "o2"),
                                    tokenizer=str(VOCAB)))
    assert len(plan.files) == 2


def test_a_quoted_glob_lists_the_directories_it_matches_and_a_file_is_read_once_by_any_path(tmp_path):
    """`prepare 'corpus/*'` reads what the shell's expansion would give it: a matched
    subdirectory's files too (they were left out, unsaid). A file named twice, by other spellings
    of its path or through a link to it, is read once."""
    import os
    import shutil

    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    shutil.copyfile(SAMPLE_TEXT, corpus / "top.txt")
    shutil.copyfile(SAMPLE_TEXT, corpus / "sub" / "inner.txt")
    plan = plan_tasks(config([str(corpus / "*")]))
    assert [f["path"] for f in plan.files] == [str(corpus / "sub" / "inner.txt"), str(corpus / "top.txt")]
    assert plan.skipped_files == []
    os.symlink(corpus / "top.txt", tmp_path / "top-link.txt")
    plan = plan_tasks(config([str(corpus), f"{corpus}/../corpus/top.txt", f"{corpus}//sub/./inner.txt",
                              str(tmp_path / "top-link.txt")]))
    assert [f["path"] for f in plan.files] == [str(corpus / "sub" / "inner.txt"), str(corpus / "top.txt")]
    assert [(s["path"], s["reason"]) for s in plan.skipped_files] == [(str(tmp_path / "top-link.txt"), "file_seen")]
def test_a_glob_skips_and_warns_about_a_vocabulary_and_a_binary_file(tmp_path, caplog):
    """`prepare corpus/*` over a folder holding the vocab and a binary file reads the text only."""
    import logging
    import shutil

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(SAMPLE_TEXT, corpus / "a.txt")
    shutil.copy(VOCAB, corpus / "vocab.txt")
    shutil.copy(VOCAB, corpus / "tokens.txt")  # a vocabulary by its content, whatever its name
    (corpus / "model.bin").write_bytes(bytes(range(256)) * 64)
    words = corpus / "words.txt"  # one word per line is text: no special tokens, no ## pieces
    words.write_text("\n".join(f"word{i}" for i in range(200)) + "\n")
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        plan = plan_tasks(config([str(corpus / "*")]))
    assert [f["path"] for f in plan.files] == [str(corpus / "a.txt"), str(words)]
    reasons = {s["path"]: s["reason"] for s in plan.skipped_files}
    assert reasons == {str(corpus / "vocab.txt"): "vocabulary", str(corpus / "tokens.txt"): "vocabulary",
                       str(corpus / "model.bin"): "binary"}
    assert "special tokens [CLS], [MASK], [PAD], [SEP], [UNK]" in plan.skipped_files[0]["detail"] + \
        plan.skipped_files[1]["detail"] + plan.skipped_files[2]["detail"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for path in reasons:
        assert any(path in w for w in warned), (path, warned)
    # given with -t, the same file is the tokenizer; given as an input alone, nothing is left to read
    with pytest.raises(InputError, match="vocabulary"):
        plan_tasks(config([str(corpus / "vocab.txt")]))


def test_a_multistream_index_alone_is_skipped_and_beside_its_dump_read_with_it(tmp_path, caplog):
    """A dump's multistream index named alone (compressed or not) is not read as 206 "sentences"
    of offset:page_id:title; named with its dump (a directory) it is the dump's side file."""
    import bz2
    import logging
    import shutil

    wiki = VOCAB.parents[1] / "tests" / "data" / "wiki"
    index = wiki / "enwiki-shortened-pages-articles-multistream-index.txt.bz2"
    plain = tmp_path / "lines.txt"  # the same lines under another name, uncompressed
    plain.write_bytes(bz2.decompress(index.read_bytes()))
    for path in (index, plain):
        with pytest.raises(InputError, match=r"every input file was skipped: .* \(looks like a Wikipedia multistream "
                                             r"index .* give the dump beside it"):
            plan_tasks(config([str(path)]))
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        plan = plan_tasks(config([str(index), str(SAMPLE_TEXT)]))
    assert [f["path"] for f in plan.files] == [str(SAMPLE_TEXT)]
    assert [(s["path"], s["reason"]) for s in plan.skipped_files] == [(str(index), "wiki_index")]
    assert "skipping " + str(index) + " (wiki_index)" in caplog.text
    folder = tmp_path / "dump"
    folder.mkdir()
    for name in (index.name, "enwiki-shortened-pages-articles-multistream.xml.bz2"):
        shutil.copy(wiki / name, folder / name)
    plan = plan_tasks(config([str(folder)]))
    assert [f["format"] for f in plan.files] == ["wikidump"]
    assert [(s["path"], s["reason"]) for s in plan.skipped_files] == [(str(folder / index.name), "side_file")]


def test_hidden_files_and_directories_are_not_inputs(tmp_path):
    """A corpus directory that is a git checkout: .git/ and the like are not training text."""
    corpus = tmp_path / "corpus"
    for name in ("a.txt", "sub/b.txt", ".notes.txt", ".git/HEAD", ".git/hooks/pre-commit.sample", "sub/.cache/c.txt"):
        (corpus / name).parent.mkdir(parents=True, exist_ok=True)
        (corpus / name).write_text("One sentence here. Another one there.\n")
    plan = plan_tasks(config([corpus]))
    assert [f["path"] for f in plan.files] == [str(corpus / "a.txt"), str(corpus / "sub" / "b.txt")]


def test_the_output_inside_an_input_directory_is_not_input(tmp_path, monkeypatch):
    """``prepare data/ -o data/out``: the run's own files are never read, so the same command resumes."""
    from mlm_pipeline.pipeline import run_prepare

    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_bytes(SAMPLE_TEXT.read_bytes())
    run = PrepareConfig(inputs=[str(data)], output=str(data / "out"), tokenizer=str(VOCAB), workers=1, progress=False)
    first = run_prepare(run, show_progress=False)
    assert [f["path"] for f in first["inputs"]] == [str(data / "a.txt")]
    again = run_prepare(run, show_progress=False)  # the output's shards and markers are not new inputs
    assert again["shards"] == first["shards"]
    with pytest.raises(InputError, match="is inside the output"):
        plan_tasks(config([data / "out"]).model_copy(update={"output": str(data)}))
    # a file named as an input is read wherever it lies (prepare a.txt -o .)
    named = plan_tasks(config([data / "a.txt"]).model_copy(update={"output": str(data)}))
    assert [f["path"] for f in named.files] == [str(data / "a.txt")]
    monkeypatch.chdir(tmp_path)  # named by a relative path, `./` or `..` in it: still the file named (it was left out)
    for spelled in ("./data/a.txt", "data/../data/a.txt"):
        named = plan_tasks(config([spelled]).model_copy(update={"output": "data"}))
        assert [f["path"] for f in named.files] == [str(data / "a.txt")], spelled
    # the input directory through a link, the output by its real path: still left out
    (tmp_path / "link").symlink_to(data)
    linked = plan_tasks(config([tmp_path / "link"]).model_copy(update={"output": str(data / "out")}))
    assert [f["path"] for f in linked.files] == [str(tmp_path / "link" / "a.txt")]


@pytest.mark.parametrize("encoding, said", [("utf-16", "it starts with a byte-order mark); convert it to UTF-8 "
                                                       "first: iconv -f UTF-16 -t UTF-8"),
                                            ("utf-16-le", "every other byte: text in UTF-16LE; convert it to "
                                                          "UTF-8 first: iconv -f UTF-16LE -t UTF-8"),
                                            ("utf-16-be", "iconv -f UTF-16BE -t UTF-8")])
def test_a_utf16_text_file_is_named_as_such_with_how_to_convert_it(tmp_path, encoding, said):
    utf16 = tmp_path / "notes.txt"
    utf16.write_bytes(SAMPLE_TEXT.read_text(encoding="utf-8").encode(encoding))
    plan = plan_tasks(config([utf16, SAMPLE_TEXT]))
    [skipped] = plan.skipped_files
    assert skipped["path"] == str(utf16) and skipped["reason"] == "binary"
    assert said in skipped["detail"] and "text in UTF-16" in skipped["detail"]


def test_a_program_is_named_as_a_program_not_as_utf16_text(tmp_path, caplog):
    """An executable (here this Python's own) has many NUL bytes, often every other one in its
    zero-padded header: it is skipped as an ELF file, with no advice to convert it, and said once."""
    import logging
    import os
    import shutil as sh
    import sys

    program = tmp_path / "tool.bin"
    sh.copy(os.path.realpath(sys.executable), program)
    padded = tmp_path / "padded.bin"  # no known signature, NUL in every other byte, not text
    padded.write_bytes(bytes(b for i in range(4096) for b in (0, (i * 37) % 32)))
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        plan = plan_tasks(config([program, padded, SAMPLE_TEXT]))
    details = {s["path"]: s["detail"] for s in plan.skipped_files}
    assert details[str(program)] == "binary data; it looks like an executable (ELF)"
    assert "UTF-16" not in details[str(padded)] and "NUL bytes" in details[str(padded)]
    assert caplog.text.count(f"skipping {program}") == 1


def test_a_fifo_or_stdin_named_as_input_is_refused_as_not_a_regular_file(tmp_path):
    """A named pipe, ``/dev/stdin`` or a device has no size and cannot be split or read again on a
    rerun: it is refused as what it is (it was skipped as "an empty file"). In a directory or a
    glob it is skipped as ``unreadable``, like a socket."""
    import os
    import shutil

    fifo = tmp_path / "corpus.fifo"
    os.mkfifo(fifo)
    def planned(name: str):
        return plan_tasks(PrepareConfig(inputs=[name], output=str(tmp_path / "out"), tokenizer=str(VOCAB)))

    # (/dev/stdin is a regular file only when the test runner's stdin is one)
    for name in [str(fifo), "/dev/null", *(["/dev/stdin"] if not os.path.isfile("/dev/stdin") else [])]:
        with pytest.raises(InputError, match=f"^{name}: not a regular file"):
            planned(name)
    shutil.copyfile(SAMPLE_TEXT, tmp_path / "a.txt")
    for given in (str(tmp_path), str(tmp_path / "*")):
        plan = planned(given)
        assert [f["path"] for f in plan.files] == [str(tmp_path / "a.txt")]
        assert [(s["path"], s["reason"], s["detail"]) for s in plan.skipped_files] == [
            (str(fifo), "unreadable", "not a regular file")]


def test_a_plan_of_too_many_tasks_is_refused_naming_the_flag(tmp_path, monkeypatch):
    """A ceiling on the task count, checked before the input is cut (pieces of a tiny size would
    not fit in memory) and on the tasks made (small files share tasks)."""
    from mlm_pipeline import plan as planning

    size = SAMPLE_TEXT.stat().st_size
    assert len(plan_tasks(config([SAMPLE_TEXT], split_bytes=1024)).tasks) == 5  # 4,394 bytes
    monkeypatch.setattr(planning, "MAX_TASKS", 3)
    with pytest.raises(ConfigError, match=rf"--split-size 1,024 bytes cuts {size:,} bytes of input into about 4 tasks, "
                                          rf"more than 3: give a larger --split-size \(tasks of 1,\d+ bytes or more\)"):
        plan_tasks(config([SAMPLE_TEXT], split_bytes=1024))
    for i in range(5):  # five small files, five tasks: only the tasks made tell
        (tmp_path / f"{i}.txt").write_text("One sentence.\n" * 100)
    with pytest.raises(ConfigError, match=r"--split-size 2,000 bytes cuts 7,000 bytes of input into 5 tasks, more than 3"):
        plan_tasks(config([tmp_path], split_bytes=2000))
    monkeypatch.setattr(planning, "MAX_TASKS", 5)
    assert len(plan_tasks(config([tmp_path], split_bytes=2000)).tasks) == 5
