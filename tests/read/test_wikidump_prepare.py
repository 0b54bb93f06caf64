"""A Wikipedia dump through the whole ``prepare``: detection, planning, workers, Ray, bad streams.

Real runs on the bundled dump excerpts (206 pages: 98 articles kept; see ``test_wikidump.py``
for the sample's facts), with the bundled vocab.
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

from conftest import VOCAB
from helpers_run import comparable, shard_table
from read.test_wikidump import BGWIKI, MULTI, MULTI_INDEX, SAMPLE_ARTICLES, SAMPLE_SKIPS, SINGLE, TABLES

OFFSETS = [638, 112682, 576501, 1075205, 1618059]  # the page streams of MULTI (from its index)
SMALL = "300KB"  # MULTI cut at streams 576501, 1075205 and 1618059: four tasks


def config(inputs, output, **overrides):
    from mlm_pipeline.config import build_config

    values = {"inputs": [str(i) for i in inputs], "output": str(output), "tokenizer": str(VOCAB),
              "workers": 1, "progress": False, **overrides}
    return build_config(values)


def prepare(inputs, output, **overrides) -> dict:
    from mlm_pipeline.pipeline import run_prepare

    return run_prepare(config(inputs, output, **overrides), show_progress=False)


def cli(*args, check_code: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ}
    if env.get("PYTHONPATH"):  # the same package from the test's working directory
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep))
    proc = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == check_code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def manifest_of(output: Path) -> dict:
    return json.loads((output / "manifest.json").read_text())


def plan_of(output: Path) -> dict:
    return json.loads((output / "_plan.json").read_text())


def digests(manifest: dict) -> list[str]:
    return [s["sha256"] for s in manifest["shards"]]


def reading_totals(manifest: dict) -> dict:
    """What the documents decide, whatever the file's packing and the task cuts."""
    t = manifest["totals"]
    return {k: t[k] for k in ("documents_read", "documents_skipped", "sentences", "tokens")}


@pytest.fixture(scope="module")
def plain_xml(tmp_path_factory) -> Path:
    """The sample as plain XML, under a name that does not say it is a dump (detected by head)."""
    path = tmp_path_factory.mktemp("xml") / "export.xml"
    path.write_bytes(bz2.decompress(SINGLE.read_bytes()))
    return path


@pytest.fixture(scope="module")
def multi_baseline(tmp_path_factory) -> dict:
    """The multistream sample in four tasks, one worker: what other executors must equal."""
    out = tmp_path_factory.mktemp("multi-baseline")
    manifest = prepare([MULTI], out, split_bytes=SMALL)
    manifest["_dir"] = out
    return manifest


# --------------------------------------------------------------------------- one command


def test_one_command_reads_each_kind_of_dump(tmp_path, plain_xml):
    """``prepare DUMP -o OUT -t VOCAB`` with nothing else but a task size that cuts these small
    dumps (the default is at least 4 MiB): multistream (index found beside it), single-stream bz2
    and plain XML are detected, split and read to the same documents."""
    runs = {}
    for kind, dump in (("multistream", MULTI), ("bz2", SINGLE), ("xml", plain_xml)):
        out = tmp_path / kind
        proc = cli("prepare", dump, "-o", out, "-t", VOCAB, "--workers", "1", "--split-size", "1MiB")
        assert f"documents read {SAMPLE_ARTICLES}; skipped: disambiguation 8, namespace 1, redirect 99" in proc.stdout
        manifest, plan = manifest_of(out), plan_of(out)
        (file,) = plan["files"]
        assert file["format"] == "wikidump" and file["bytes"] == dump.stat().st_size
        pieces = [p for t in plan["tasks"] for p in t["pieces"]]
        assert {p["extra"]["kind"] for p in pieces} == {kind}
        assert all(p.get("compression") is None for p in pieces)  # the format splits a .bz2 itself
        assert manifest["totals"]["documents_read"] == SAMPLE_ARTICLES
        assert manifest["totals"]["documents_skipped"] == SAMPLE_SKIPS
        assert manifest["totals"]["bytes_read"] == dump.stat().st_size
        runs[kind] = (manifest, pieces)
    # a 1 MiB task size cuts each file its own way: at a stream start of the index, at a
    # compressed byte, every 1 MiB of XML
    assert [p["start"] for p in runs["multistream"][1]] == [0, 1075205]
    assert [p["start"] for p in runs["bz2"][1]] == [0, 1 << 20]
    assert len(runs["xml"][1]) == -(-plain_xml.stat().st_size // (1 << 20))
    assert len({json.dumps(reading_totals(m), sort_keys=True) for m, _ in runs.values()}) == 1
    report = cli("report", tmp_path / "multistream").stdout
    assert "documents seen 206: read 98, skipped 108" in report
    for reason, count in SAMPLE_SKIPS.items():
        assert f"skipped documents ({reason}): {count}" in report


def test_utf16_dump_and_dump_without_siteinfo_are_detected(tmp_path):
    """A UTF-16 dump is not taken for binary (its NUL bytes); a dump whose name says nothing is
    known by its ``<mediawiki`` root."""
    manifest = prepare([BGWIKI, TABLES], tmp_path)
    assert [f["format"] for f in plan_of(tmp_path)["files"]] == ["wikidump", "wikidump"]
    assert manifest["skipped_files"] == []
    assert manifest["totals"]["documents_read"] == 1 + 5
    assert manifest["totals"]["documents_skipped"] == {"namespace": 2}


def test_the_same_documents_give_the_same_shards(tmp_path, plain_xml):
    """One task per dump: the three packings of the sample give byte-identical shards."""
    manifests = [prepare([dump], tmp_path / dump.name, split_bytes="1GB") for dump in (MULTI, SINGLE, plain_xml)]
    assert all(m["tasks"] == 1 for m in manifests)
    assert digests(manifests[0]) == digests(manifests[1]) == digests(manifests[2])
    assert manifests[0]["totals"]["instances"] > 1000


def test_a_directory_with_dump_and_index_reads_the_dump_once(tmp_path, multi_baseline):
    folder = tmp_path / "dump"
    folder.mkdir()
    shutil.copy(MULTI, folder)
    shutil.copy(MULTI_INDEX, folder)
    manifest = prepare([folder], tmp_path / "out", split_bytes=SMALL)
    assert [(s["path"], s["reason"]) for s in manifest["skipped_files"]] == [
        (str(folder / MULTI_INDEX.name), "side_file")]
    assert shard_table(manifest) == shard_table(multi_baseline)
    assert manifest["totals"] == {**multi_baseline["totals"], "files_skipped": {"side_file": 1}}


def test_wiki_index_names_an_index_kept_elsewhere(tmp_path, multi_baseline, monkeypatch):
    lone = tmp_path / "dump.xml.bz2"  # no index beside it, and no dump name
    shutil.copy(MULTI, lone)
    monkeypatch.chdir(MULTI_INDEX.parent)
    manifest = prepare([lone], tmp_path / "out", split_bytes=SMALL, wiki_index=MULTI_INDEX.name)
    assert shard_table(manifest) == shard_table(multi_baseline)
    plan = plan_of(tmp_path / "out")
    assert plan["files"][0]["side_files"] == [str(MULTI_INDEX)]
    assert [p["start"] for t in plan["tasks"] for p in t["pieces"]] == [0, *OFFSETS[2:]]
    # without it the file is cut at compressed bytes, into other tasks, to the same documents
    unindexed = prepare([lone], tmp_path / "out2", split_bytes=SMALL)
    assert {p["extra"]["kind"] for t in plan_of(tmp_path / "out2")["tasks"] for p in t["pieces"]} == {"bz2"}
    assert reading_totals(unindexed) == reading_totals(manifest)


def test_wiki_settings_reach_the_reader(tmp_path, multi_baseline):
    both = prepare([MULTI], tmp_path / "ns", split_bytes=SMALL, wiki_namespaces="4, 0")
    assert config([MULTI], tmp_path / "x", wiki_namespaces="4, 0,0").wiki_namespaces == "0,4"
    # the page in namespace 4 is a redirect: now skipped as one
    assert both["totals"]["documents_read"] == SAMPLE_ARTICLES
    assert both["totals"]["documents_skipped"] == {"disambiguation": 8, "redirect": 100}
    headings = prepare([MULTI], tmp_path / "headings", split_bytes=SMALL, wiki_keep_headings=True)
    tables = prepare([MULTI], tmp_path / "tables", split_bytes=SMALL, wiki_keep_tables=True)
    base = multi_baseline["totals"]
    # ~2,200 headings become paragraphs of their own; tables add ~21k tokens of cell text
    assert headings["totals"]["sentences"] > base["sentences"] + 1500
    assert tables["totals"]["tokens"] > base["tokens"] + 15_000
    assert headings["totals"]["documents_read"] == tables["totals"]["documents_read"] == SAMPLE_ARTICLES
    assert headings["output_fingerprint"] != multi_baseline["output_fingerprint"]
    # the reference sections and citation items (see test_wikidump.py): 2,079 more paragraphs
    references = prepare([MULTI], tmp_path / "references", split_bytes=SMALL, wiki_keep_references=True)
    assert (base["sentences"], references["totals"]["sentences"]) == (21_104, 23_183)
    assert references["totals"]["documents_read"] == SAMPLE_ARTICLES
    assert references["output_fingerprint"] != multi_baseline["output_fingerprint"]


def test_bad_wiki_settings_are_config_errors(tmp_path, plain_xml):
    from mlm_pipeline.errors import ConfigError, InputError

    with pytest.raises(ConfigError, match="wiki-namespaces.*namespace numbers"):
        config([MULTI], tmp_path / "o", wiki_namespaces="articles")
    with pytest.raises(InputError, match="no such file.*wiki-index"):
        prepare([MULTI], tmp_path / "o", wiki_index=str(tmp_path / "missing-index.txt.bz2"))
    with pytest.raises(InputError, match="multistream index goes with a .bz2 dump"):
        prepare([plain_xml], tmp_path / "o2", wiki_index=str(MULTI_INDEX))


# --------------------------------------------------------------------------- workers, executors


def test_workers_1_and_2_give_identical_shards(tmp_path, multi_baseline):
    assert multi_baseline["tasks"] == 4
    two = prepare([MULTI], tmp_path, split_bytes=SMALL, workers=2)
    assert comparable(two) == comparable(multi_baseline)
    for s in two["shards"]:
        assert (tmp_path / s["path"]).read_bytes() == (multi_baseline["_dir"] / s["path"]).read_bytes()


@pytest.mark.ray
def test_ray_gives_the_local_shards(ray_cluster, tmp_path, multi_baseline):
    manifest = prepare([MULTI], tmp_path, split_bytes=SMALL, executor="ray", ray_address=ray_cluster.address)
    assert comparable(manifest) == comparable(multi_baseline)
    for s in manifest["shards"]:
        assert (tmp_path / s["path"]).read_bytes() == (multi_baseline["_dir"] / s["path"]).read_bytes()


@pytest.mark.s3
def test_dump_on_s3_gives_the_local_shards(seaweedfs, tmp_path, multi_baseline):
    """Read from the object store (the index found beside the dump there), no local copy."""
    from conftest_servers import s3_env

    prefix = seaweedfs.new_prefix("wiki")
    client = seaweedfs.client()
    for path in (MULTI, MULTI_INDEX):
        client.put_object(Bucket=seaweedfs.bucket, Key=f"{prefix.split('/', 3)[3]}/{path.name}",
                          Body=path.read_bytes())
    with s3_env(seaweedfs):
        manifest = prepare([f"{prefix}/{MULTI.name}"], tmp_path, split_bytes=SMALL)
    assert manifest["skipped_files"] == []
    assert shard_table(manifest) == shard_table(multi_baseline)
    assert plan_of(tmp_path)["files"][0]["side_files"] == [f"{prefix}/{MULTI_INDEX.name}"]


# --------------------------------------------------------------------------- bad streams


def _dump_copy(folder: Path) -> Path:
    folder.mkdir()
    shutil.copy(MULTI_INDEX, folder)
    return Path(shutil.copy(MULTI, folder))


def _markers(output: Path) -> list[str]:
    return sorted(p.stem for p in (output / "_tasks").glob("*.json"))


def test_truncated_dump_fails_its_last_task_only(tmp_path, multi_baseline):
    """A dump cut short (a download not finished): the error names the file and the stream;
    every other task completes. Once the download is finished, the same command completes the
    run, redoing only that task, to the shards of a run on the whole dump."""
    dump = _dump_copy(tmp_path / "in")
    dump.write_bytes(MULTI.read_bytes()[:-2000])
    out = tmp_path / "out"
    proc = cli("prepare", dump, "-o", out, "-t", VOCAB, "--workers", "1", "--split-size", SMALL, check_code=2)  # an input error
    assert f"task 00003 ({dump} [bytes {OFFSETS[-1]}:end]) failed" in proc.stderr
    assert f"{dump}: truncated bz2 data" in proc.stderr and "compressed byte offset 1618063" in proc.stderr
    assert _markers(out) == ["00000", "00001", "00002"] and not (out / "manifest.json").exists()
    first = (out / "_tasks" / "00000.json").stat().st_mtime_ns
    shutil.copy(MULTI, dump)  # the download finished: only the failed task's piece is longer
    cli("prepare", dump, "-o", out, "-t", VOCAB, "--workers", "1", "--split-size", SMALL)
    assert _markers(out) == ["00000", "00001", "00002", "00003"]
    assert (out / "_tasks" / "00000.json").stat().st_mtime_ns == first  # not redone
    manifest = manifest_of(out)
    assert shard_table(manifest) == shard_table(multi_baseline)
    assert manifest["totals"] == multi_baseline["totals"]


def test_an_edit_in_the_page_a_completed_xml_piece_finished_is_refused(tmp_path):
    """A piece of a plain XML dump reads past its end to finish its last page, and where that
    page ends is not known without reading it: a completed piece is checked with the file's size,
    so an edit there that resizes the file is refused, not read into a stale output."""
    from mlm_pipeline.errors import OutputError
    from mlm_pipeline.executors.base import run_one
    from mlm_pipeline.pipeline import run_prepare
    from mlm_pipeline.run.state import start_run

    (tmp_path / "in").mkdir()
    xml = tmp_path / "in" / "enwiki-latest-pages-articles.xml"
    xml.write_bytes(bz2.decompress(SINGLE.read_bytes()))
    cfg = config([xml], tmp_path / "out", split_bytes=str(xml.stat().st_size // 3))
    start = start_run(cfg)
    task = start.plan.tasks[0]
    assert len(start.plan.tasks) > 1 and task.pieces[0].extra["kind"] == "xml"
    run_one(task, cfg)
    data = xml.read_bytes()
    end = task.pieces[0].end
    page = data.rindex(b"<page>", 0, end)
    assert data.index(b"</page>", page) > end  # the piece's last page goes on past its end
    at = data.index(b"</text>", end)  # in that page, past the piece's range
    assert at < data.index(b"</page>", page)
    xml.write_bytes(data[:at] + b" One sentence more." + data[at:])
    with pytest.raises(OutputError, match="the input files changed since the existing run started"):
        run_prepare(cfg, show_progress=False)


def test_corrupt_stream_names_it_and_the_rerun_completes(tmp_path, multi_baseline):
    """A damaged stream in the middle of the dump: a clear error naming the file and the
    stream's bytes, and every other task completes; after the file is repaired, the same command
    completes the run, redoing only the failed task, to the shards of an undamaged run."""
    dump = _dump_copy(tmp_path / "in")
    data = bytearray(MULTI.read_bytes())
    data[800_000] ^= 0x40  # inside the stream at 576501 (task 00001)
    dump.write_bytes(bytes(data))
    out = tmp_path / "out"
    args = ("prepare", dump, "-o", out, "-t", VOCAB, "--workers", "1", "--split-size", SMALL)
    proc = cli(*args, check_code=2)  # an input error: exit 2
    assert f"task 00001 ({dump} [bytes {OFFSETS[2]}:{OFFSETS[3]}]) failed" in proc.stderr
    # the block around byte 800000 (after the 4-byte stream header)
    assert f"{dump}: corrupt bz2 data between compressed byte offsets 576505 and 838649" in proc.stderr
    assert "1 of 4 tasks failed, the other 3 completed" in proc.stderr
    assert _markers(out) == ["00000", "00002", "00003"] and not (out / "manifest.json").exists()
    first = (out / "_tasks" / "00000.json").stat().st_mtime_ns
    shutil.copy(MULTI, dump)  # repaired: same size, same plan
    cli(*args)
    manifest = manifest_of(out)
    assert _markers(out) == ["00000", "00001", "00002", "00003"]
    assert (out / "_tasks" / "00000.json").stat().st_mtime_ns == first  # not redone
    assert shard_table(manifest) == shard_table(multi_baseline)
    assert manifest["totals"] == multi_baseline["totals"]
