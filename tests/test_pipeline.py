"""End-to-end ``prepare`` on real text: determinism, resume, formats, objectives, refusal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import DATA, SAMPLE_TEXT, VOCAB, WIKIEXTRACTOR, WIKITEXT
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.inspect import read_shard
from mlm_pipeline.instances.batch import InstanceBatch
from mlm_pipeline.errors import OutputError
from mlm_pipeline.pipeline import run_prepare


def config(out, **kw) -> PrepareConfig:
    base = dict(
        inputs=[str(WIKITEXT), str(SAMPLE_TEXT), str(WIKIEXTRACTOR)],
        output=str(out),
        tokenizer=str(VOCAB),
        split_bytes=300_000,
        block_bytes=150_000,
        workers=1,
        progress=False,
    )
    base.update(kw)
    return PrepareConfig(**base)


def shard_digests(manifest: dict) -> list[tuple[str, str, int]]:
    return [(s["path"], s["sha256"], s["instances"]) for s in manifest["shards"]]


def load_all(out, manifest) -> InstanceBatch:
    return InstanceBatch.concat([read_shard(str(out / s["path"])) for s in manifest["shards"]])


def test_same_shards_with_one_and_two_workers(tmp_path):
    one = run_prepare(config(tmp_path / "w1", workers=1))
    two = run_prepare(config(tmp_path / "w2", workers=2))
    assert len(one["shards"]) >= 6  # several tasks: big file split, small files grouped
    assert shard_digests(one) == shard_digests(two)
    assert one["totals"] == two["totals"]
    for s in one["shards"]:
        assert (tmp_path / "w1" / s["path"]).read_bytes() == (tmp_path / "w2" / s["path"]).read_bytes()


def test_input_order_does_not_change_the_output(tmp_path):
    """`prepare b a` writes the bytes of `prepare a b`: output depends on the input bytes, the
    settings and the seed only."""
    inputs = [str(WIKITEXT), str(SAMPLE_TEXT), str(WIKIEXTRACTOR)]
    forward = run_prepare(config(tmp_path / "fwd", inputs=inputs))
    backward = run_prepare(config(tmp_path / "bwd", inputs=inputs[::-1]))
    assert shard_digests(forward) == shard_digests(backward) and len(forward["shards"]) >= 3


def test_every_document_read_exactly_once_across_tasks(tmp_path):
    small = run_prepare(config(tmp_path / "small", split_bytes=100_000))
    whole = run_prepare(config(tmp_path / "whole", split_bytes=64 << 20))
    assert small["tasks"] > whole["tasks"] == 1
    for key in ("documents_read", "sentences", "tokens", "bytes_read"):
        assert small["totals"][key] == whole["totals"][key], key


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_manifest_contents(tmp_path, fmt):
    m = run_prepare(config(tmp_path / "o", format=fmt))
    t = m["totals"]
    assert m["config"]["max_seq_length"] == 128 and m["tokenizer_fingerprint"]
    assert t["instances"] == sum(s["instances"] for s in m["shards"]) > 3000
    assert t["bytes_read"] == sum(os.path.getsize(p) for p in (WIKITEXT, SAMPLE_TEXT, WIKIEXTRACTOR))
    assert t["documents_read"] > 1000 and t["documents_skipped"] == {}
    assert t["masked_tokens"] == t["masked_as_mask_token"] + t["masked_as_random_token"] + t["masked_kept"]
    assert sum(t["instance_length_histogram"].values()) == t["instances"]
    import hashlib

    for s in m["shards"]:  # sizes and digests (computed while writing) match the files
        data = (tmp_path / "o" / s["path"]).read_bytes()
        assert len(data) == s["bytes"] and hashlib.sha256(data).hexdigest() == s["sha256"]
    assert not (tmp_path / "o" / "_tmp").exists()


def test_tfrecord_and_parquet_hold_the_same_instances(tmp_path):
    tf_m = run_prepare(config(tmp_path / "tf", format="tfrecord"))
    pq_m = run_prepare(config(tmp_path / "pq", format="parquet"))
    a, b = load_all(tmp_path / "tf", tf_m), load_all(tmp_path / "pq", pq_m)
    for field in ("input_ids", "segment_ids", "offsets", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field


def test_rerun_skips_completed_tasks_and_refuses_other_settings(tmp_path):
    out = tmp_path / "o"
    first = run_prepare(config(out))
    markers = {p.name: p.stat().st_mtime_ns for p in (out / "_tasks").iterdir()}
    again = run_prepare(config(out, workers=2))  # runtime settings may change
    assert shard_digests(first) == shard_digests(again)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "_tasks").iterdir()} == markers
    with pytest.raises(OutputError, match="masked-lm-prob: 0.15 in the existing run, 0.2 now"):
        run_prepare(config(out, masked_lm_prob=0.2))


def test_run_started_by_an_older_algorithm_is_not_resumed(tmp_path):
    from mlm_pipeline.run.state import ALGORITHM

    out = tmp_path / "o"
    run_prepare(config(out, inputs=[str(SAMPLE_TEXT)]))
    record = json.loads((out / "_run.json").read_text())
    assert record["algorithm"] == ALGORITHM
    del record["algorithm"]  # as the first version wrote it
    (out / "_run.json").write_text(json.dumps(record))
    with pytest.raises(OutputError, match=f"algorithm 1, now {ALGORITHM}"):
        run_prepare(config(out, inputs=[str(SAMPLE_TEXT)]))


@pytest.mark.parametrize("kind", ["reference", "electra"])
def test_a_run_of_the_earlier_tokenization_is_not_resumed(kind, tmp_path):
    """A --reference run, or one of the electra flavor, recorded before its tokenization changed
    (Python's tables) would mix two tokenizations; a default BERT run never records a version, so
    none of its runs is refused, and a switch of --reference is reported as a changed setting."""
    from mlm_pipeline.run.state import TOKENIZATION

    settings = {"reference": {"reference": True}, "electra": {"objective": "electra"}}[kind]
    out = tmp_path / "o"
    run_prepare(config(out, inputs=[str(SAMPLE_TEXT)], **settings))
    record = json.loads((out / "_run.json").read_text())
    assert record["tokenization"] == {kind: TOKENIZATION[kind]}
    del record["tokenization"]  # as the earlier version wrote it
    (out / "_run.json").write_text(json.dumps(record))
    with pytest.raises(OutputError, match=f"{kind} tokenization 1, now {TOKENIZATION[kind]}"):
        run_prepare(config(out, inputs=[str(SAMPLE_TEXT)], **settings))
    if kind == "electra":
        return
    run_prepare(config(tmp_path / "d", inputs=[str(SAMPLE_TEXT)]))
    assert "tokenization" not in json.loads((tmp_path / "d" / "_run.json").read_text())
    # switching --reference on or off is a changed setting, not another tokenization
    for existing, now in ((tmp_path / "d", True), (out, False)):
        with pytest.raises(OutputError, match=f"reference: {not now} in the existing run, {now} now") as refused:
            run_prepare(config(existing, inputs=[str(SAMPLE_TEXT)], reference=now))
        assert "tokenization" not in str(refused.value)


def test_a_rerun_of_a_complete_output_leaves_its_manifest_as_it_is(tmp_path, monkeypatch):
    """The same command over a complete output, a minute later: nothing runs, and manifest.json
    keeps its bytes (its creation time included); a damaged one is written anew."""
    import time as time_mod

    out = tmp_path / "o"
    run_prepare(config(out, inputs=[str(SAMPLE_TEXT)]))
    before = (out / "manifest.json").read_bytes()
    later = time_mod.gmtime(time_mod.time() + 60)
    monkeypatch.setattr("mlm_pipeline.run.manifest.time.gmtime", lambda *a: later)
    run_prepare(config(out, inputs=[str(SAMPLE_TEXT)]))
    assert (out / "manifest.json").read_bytes() == before
    (out / "manifest.json").write_bytes(before[:100])
    run_prepare(config(out, inputs=[str(SAMPLE_TEXT)]))
    rewritten = json.loads((out / "manifest.json").read_text())
    assert rewritten["created"] == time_mod.strftime("%Y-%m-%dT%H:%M:%SZ", later)
    assert {**rewritten, "created": None} == {**json.loads(before), "created": None}


def test_missing_task_is_redone_identically(tmp_path):
    out = tmp_path / "o"
    first = run_prepare(config(out))
    victim = first["shards"][2]
    (out / victim["path"]).unlink()
    (out / "_tasks" / f"{victim['path'].split('-')[1]}.json").unlink()
    second = run_prepare(config(out))
    assert shard_digests(first) == shard_digests(second)


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", *args], capture_output=True, text=True, **kw)


@pytest.mark.slow
def test_kill_9_then_resume_equals_uninterrupted_run(tmp_path):
    args = [str(WIKITEXT), "--tokenizer", str(VOCAB), "--split-size", "60KiB", "--dupe-factor", "3",
            "--workers", "1", "--no-progress"]
    ref = _cli("prepare", *args, "--output", str(tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "mlm_pipeline.cli", "prepare", *args, "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        done = list((out / "_tasks").glob("*.json")) if (out / "_tasks").exists() else []
        if len(done) >= 3:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_tasks = json.loads((tmp_path / "ref" / "manifest.json").read_text())["tasks"]
    assert 3 <= len(list((out / "_tasks").glob("*.json"))) < n_tasks, "kill landed outside the run"
    assert not (out / "manifest.json").exists()
    # whatever is visible under shards/ is complete: every file parses with valid CRCs
    for shard in (out / "shards").glob("*.tfrecord"):
        read_shard(str(shard))
    resumed = _cli("prepare", *args, "--output", str(out))
    assert resumed.returncode == 0, resumed.stderr
    ref_m = json.loads((tmp_path / "ref" / "manifest.json").read_text())
    res_m = json.loads((out / "manifest.json").read_text())
    assert shard_digests(ref_m) == shard_digests(res_m)
    assert ref_m["totals"] == res_m["totals"]


def test_packed_objective(tmp_path, tok):
    # sample_text has real sentences (wikitext's "sentences" are whole paragraphs)
    m = run_prepare(config(tmp_path / "p", objective="packed", inputs=[str(SAMPLE_TEXT)], format="parquet", dupe_factor=20))
    assert m["objective"] == "packed" and m["masking"] == "static"
    batch = load_all(tmp_path / "p", m)
    assert batch.next_sentence_labels is None
    assert np.all(batch.segment_ids == 0)
    lens = batch.lengths
    assert lens.max() <= 128 and lens.mean() > 0.75 * 128  # whole sentences fill instances
    for i in range(0, len(batch), 11):
        ids = batch.row(i)["input_ids"]
        assert ids[0] == tok.special.cls and ids[-1] == tok.special.sep
        assert tok.special.cls not in ids[1:]
    assert abs(m["totals"]["masked_tokens"] / lens.sum() - 0.15) < 0.01


def test_tokens_objective_is_unmasked_and_covers_every_token(tmp_path, tok):
    m = run_prepare(config(tmp_path / "t", objective="tokens", inputs=[str(SAMPLE_TEXT)], format="parquet"))
    assert m["masking"] == "none" and m["totals"]["instances"] > 0
    batch = load_all(tmp_path / "t", m)
    assert len(batch.masked_lm_ids) == 0 and batch.next_sentence_labels is None
    body = np.concatenate([batch.input_ids[batch.offsets[i] + 1 : batch.offsets[i + 1] - 1] for i in range(len(batch))])
    # every token of the text is there once (plus document separators)
    assert len(body[body != tok.special.sep]) == m["totals"]["tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_stops_cleanly_and_the_rerun_resumes(tmp_path, workers):
    # 4 MB in about 60 tasks: work is left when the first task's marker appears
    text = tmp_path / "wikitext-4x.txt"
    text.write_bytes(WIKITEXT.read_bytes() * 4)
    args = [str(text), "--tokenizer", str(VOCAB), "--split-size", "64KiB", "--dupe-factor", "3",
            "--workers", workers, "--no-progress", "--output", str(tmp_path / "o")]
    # SIGINT raises KeyboardInterrupt, as in a terminal: a command started in the background by a
    # shell without job control (a CI script's `&`, nohup) inherits SIGINT ignored, pytest too,
    # and so would the command
    as_from_a_terminal = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                          "runpy.run_module('mlm_pipeline.cli', run_name='__main__', alter_sys=True)")
    proc = subprocess.Popen([sys.executable, "-c", as_from_a_terminal, "prepare", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while time.time() < deadline and not list((tmp_path / "o").glob("_tasks/*.json")):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not (tmp_path / "o" / "manifest.json").exists()
    done = _cli("prepare", *args)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["tasks"] > 5


def test_block_bytes_counts_utf8_bytes_not_characters(tmp_path):
    """Four 1000-character Chinese documents (3000 bytes each) with 4000-byte blocks: a block ends
    after every second document (6000 bytes), not after the fourth (4000 characters)."""
    from mlm_pipeline.executors.local import LocalExecutor
    from mlm_pipeline.run.state import start_run
    from mlm_pipeline.task import text_bytes

    assert text_bytes(["plain", "紅樓夢", "é", "\ud800"]) == 5 + 9 + 2 + 3
    chinese = "".join(ch for ch in (DATA / "hongloumeng-300KB.txt").read_text(encoding="utf-8") if "\u4e00" <= ch <= "\u9fff")
    docs = ["\n".join(chinese[i * 1000 + j * 100:i * 1000 + (j + 1) * 100] for j in range(10)) for i in range(4)]
    corpus = tmp_path / "zh.txt"
    corpus.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    cfg = config(tmp_path / "out", inputs=[str(corpus)], block_bytes=4000)
    start = start_run(cfg)
    assert len(start.pending) == 1
    reports: list[dict] = []
    (marker,) = LocalExecutor(cfg).run(start.pending, reports.append)
    assert marker["stats"]["documents_read"] == 4
    # one report per finished block, then the task's final one
    assert [r["documents"] for r in reports] == [2, 2, 0]


@pytest.mark.parametrize("block_bytes", [1024, 4000, 9_999, 65_536, 1 << 22])
def test_blocks_end_after_the_document_that_fills_them_as_one_at_a_time_would(tmp_path, block_bytes):
    """Blocks are filled from runs of documents (one bisection per block): every block ends after
    the first document that takes it to ``block_bytes`` UTF-8 bytes, exactly where adding the
    documents one at a time would end it, on English and Chinese text with uneven documents;
    the runs hold the same documents as reading one at a time."""
    from mlm_pipeline.read import Piece, ReadOptions, iter_document_runs, iter_documents
    from mlm_pipeline.stats import ReadStats
    from mlm_pipeline.plan import Task
    from mlm_pipeline.task import _blocks, documents_bytes, text_bytes

    zh_lines = (DATA / "hongloumeng-300KB.txt").read_text(encoding="utf-8").splitlines()[:600]
    zh = "\n".join(line + "\n" * (i % 5 == 0) for i, line in enumerate(zh_lines))  # documents of 5 lines
    corpus = tmp_path / "mixed.txt"
    corpus.write_text(WIKITEXT.read_text(encoding="utf-8")[:300_000] + "\n\n" + zh, encoding="utf-8")
    piece = Piece(str(corpus), "text")
    one_at_a_time = list(iter_documents(piece, ReadOptions(), ReadStats()))
    runs = list(iter_document_runs(piece, ReadOptions(), ReadStats()))
    assert [d for run in runs for d in run] == one_at_a_time and 1 < len(runs) < len(one_at_a_time)
    assert documents_bytes(one_at_a_time) == [text_bytes(d) for d in one_at_a_time]
    expected, block, size = [], [], 0
    for doc in one_at_a_time:
        block.append(doc)
        size += text_bytes(doc)
        if size >= block_bytes:
            expected.append((block, True))
            block, size = [], 0
    if block:
        expected.append((block, False))
    cfg = config(tmp_path / "out", inputs=[str(corpus)], block_bytes=block_bytes)
    task = Task(task_id="t0", index=0, pieces=(piece,), input_bytes=corpus.stat().st_size)
    got = [(docs, full) for _, docs, full in _blocks(task, cfg, ReadOptions(), ReadStats())]
    assert got == expected
    assert len(expected) > 1 or block_bytes == 1 << 22
