"""Corrupted, truncated and missing shards, as ``verify``, a resumed ``prepare``, ``inspect`` and
the torch loader see them: each names the shard, and the rerun rewrites the clean bytes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from faults.helpers import assert_as_clean, run_config


def _copy_clean(clean_run, tmp_path, fmt) -> tuple[Path, dict]:
    manifest = clean_run(fmt)
    from faults.conftest import _CLEAN

    out = tmp_path / "out"
    shutil.copytree(_CLEAN[fmt][1], out)
    return out, manifest


def _cli(*args) -> tuple[int, str]:
    from mlm_pipeline.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def _flip(path: Path, at: float = 0.4) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x20
    path.write_bytes(bytes(data))


def _rerun(corpus, out, fmt):
    from mlm_pipeline.pipeline import run_prepare

    return run_prepare(run_config(corpus, out, fmt=fmt), show_progress=False)


def _loader_error(out: Path, verify: str) -> str:
    from mlm_pipeline.errors import ShardDamaged
    from mlm_pipeline.torch.dataset import MLMDataset
    from mlm_pipeline.torch import manifest as loader_manifest

    loader_manifest._VERIFIED.clear()
    with pytest.raises(ShardDamaged) as err:
        for _ in MLMDataset(str(out), shuffle=False, verify=verify):
            pass
    return str(err.value)


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
def test_a_flipped_byte_is_named_by_verify_loader_and_inspect_and_repaired(fmt, corpus, clean_run, tmp_path, tally):
    pytest.importorskip("torch")
    out, clean = _copy_clean(clean_run, tmp_path, fmt)
    victim = out / clean["shards"][3]["path"]
    _flip(victim)

    code, text = _cli("verify", out)
    assert code == 1
    assert f"BAD {clean['shards'][3]['path']}: sha256" in text and "1 of" in text
    assert _cli("verify", out, "--size-only")[0] == 0  # a flipped byte keeps the size

    # the loader: by the manifest's SHA-256 (default), and by the format's own checksums alone
    assert str(victim) in _loader_error(out, "sha256") and "sha256" in _loader_error(out, "sha256")
    message = _loader_error(out, "none")
    assert str(victim) in message
    assert ("CRC" in message) or ("crc" in message.lower())

    code, text = _cli("inspect", out, "-n", "100000", "--json")
    assert code == 2 and str(victim) in text

    code, text = _cli("verify", out, "--repair")
    assert code == 1 and "1 task(s) marked not done" in text
    _rerun(corpus, out, fmt)
    assert_as_clean(out, clean)
    assert _cli("verify", out)[0] == 0
    tally.record(f"flipped byte in a {fmt} shard")


def test_a_truncated_shard_is_redone_on_resume(corpus, clean_run, tmp_path, tally, caplog):
    out, clean = _copy_clean(clean_run, tmp_path, "parquet")
    entry = clean["shards"][2]
    victim = out / entry["path"]
    victim.write_bytes(victim.read_bytes()[: entry["bytes"] // 2])
    (out / "manifest.json").unlink()  # the run was killed before its manifest

    code, text = _cli("verify", out)
    assert code == 1 and f"{entry['bytes'] // 2} bytes, the run recorded {entry['bytes']} (truncated)" in text
    assert "task markers" in text

    with caplog.at_level("WARNING", logger="mlm_pipeline"):
        _rerun(corpus, out, "parquet")
    assert f"shard {entry['path']} is {entry['bytes'] // 2} bytes, its marker says {entry['bytes']}" in caplog.text
    assert_as_clean(out, clean)
    tally.record("truncated shard, resume")


def test_a_missing_shard_is_named_and_redone(corpus, clean_run, tmp_path, tally):
    pytest.importorskip("torch")
    out, clean = _copy_clean(clean_run, tmp_path, "parquet")
    entry = clean["shards"][-1]
    (out / entry["path"]).unlink()

    code, text = _cli("verify", out)
    assert code == 1 and f"BAD {entry['path']}: missing" in text
    message = _loader_error(out, "size")
    assert str(out / entry["path"]) in message and "missing" in message

    (out / "manifest.json").unlink()
    _rerun(corpus, out, "parquet")
    assert_as_clean(out, clean)
    tally.record("missing shard, resume")


def test_claim_workers_redo_a_task_whose_shard_is_missing(corpus, clean_run, tmp_path, caplog):
    """A claim worker skips any task with a marker: the resume deletes the markers it does not
    count, so the task is claimed, redone, and the manifest written."""
    out, clean = _copy_clean(clean_run, tmp_path, "parquet")
    entry = clean["shards"][1]
    (out / entry["path"]).unlink()
    (out / "manifest.json").unlink()
    from mlm_pipeline.pipeline import run_prepare

    with caplog.at_level("WARNING", logger="mlm_pipeline"):
        summary = run_prepare(run_config(corpus, out, claim=True, lease_seconds=20), show_progress=False)
    assert f"shard {entry['path']} is missing" in caplog.text
    assert summary["ran"] == [entry["path"].split("-")[1]]  # part-TASK-K
    assert summary["manifest"] is not None
    assert_as_clean(out, clean)


def test_a_rerun_deletes_shards_an_earlier_attempt_left_beyond_its_own(corpus, clean_run, tmp_path):
    """An attempt that was stopped (or read other input) may have committed more shards of a
    task than its rerun writes: the rerun deletes them."""
    out, clean = _copy_clean(clean_run, tmp_path, "parquet")
    task_id = clean["shards"][0]["path"].split("-")[1]
    own = sorted((out / "shards").glob(f"part-{task_id}-*"))
    extra = [own[0].with_name(f"part-{task_id}-{len(own) + k:05d}.parquet") for k in range(2)]
    for path in extra:
        shutil.copyfile(own[0], path)
    (out / "_tasks" / f"{task_id}.json").unlink()  # the task stopped before its marker
    (out / "manifest.json").unlink()
    _rerun(corpus, out, "parquet")
    assert not any(p.exists() for p in extra)
    assert_as_clean(out, clean)


def test_replacing_a_run_that_completed_no_task_empties_its_shards(corpus, clean_run, tmp_path, caplog):
    """A run stopped before any task completed, with shards of 500 instances committed, then
    run again with 1,500 a shard: the replaced run's shards are gone, not read by a glob."""
    from mlm_pipeline.pipeline import run_prepare

    clean = clean_run("parquet")
    out = tmp_path / "out"
    run_prepare(run_config(corpus, out, max_instances_per_shard=500), show_progress=False)
    for marker in (out / "_tasks").iterdir():
        marker.unlink()  # as if stopped with shards committed and no task done
    (out / "manifest.json").unlink()
    assert len(list((out / "shards").iterdir())) > len(clean["shards"])
    with caplog.at_level("WARNING", logger="mlm_pipeline"):
        _rerun(corpus, out, "parquet")
    assert "replacing the run" in caplog.text
    assert_as_clean(out, clean)


def test_verify_of_a_directory_without_a_run_exits_2(tmp_path):
    code, text = _cli("verify", tmp_path)
    assert code == 2 and "holds no run" in text


def test_the_manifest_records_what_verify_checks(clean_run):
    """Every shard of a clean run passes, and the loader's default is the full check."""
    import inspect as _inspect

    from mlm_pipeline.torch.dataset import MLMDataset

    assert _inspect.signature(MLMDataset).parameters["verify"].default == "sha256"
    manifest = clean_run("parquet")
    assert all(len(s["sha256"]) == 64 and s["bytes"] > 0 for s in manifest["shards"])


def test_repair_deletes_a_damaged_marker_and_keeps_one_it_cannot_read(corpus, tmp_path, caplog):
    """A marker that is not JSON is damaged: its task is redone. One that cannot be read at all
    (a storage error; here its path is a directory) tells nothing of its task: it is named, and
    kept."""
    import logging

    from mlm_pipeline.pipeline import run_prepare
    from mlm_pipeline.verify import forget_bad_tasks, verify_output

    out = tmp_path / "out"
    run_prepare(run_config(corpus, out))
    (out / "manifest.json").unlink()
    damaged, unread, *_ = sorted((out / "_tasks").glob("*.json"))
    damaged.write_text("{not json")
    unread.rename(tmp_path / "saved.json")
    unread.mkdir()
    result = verify_output(str(out))
    assert {p.problem for p in result.problems} == {"task marker is damaged", "task marker cannot be read"}
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        assert forget_bad_tasks(str(out), result) == [damaged.stem]
    assert not damaged.exists() and unread.is_dir()
    assert f"{unread} cannot be read now: kept" in caplog.text


def test_verify_of_an_unfinished_run_says_so_and_fails(corpus, clean_run, tmp_path):
    """A run with tasks not done (an array worker's share, a run stopped, a repair not rerun):
    its shards so far match, but verify does not pass it as whole."""
    out, clean = _copy_clean(clean_run, tmp_path, "parquet")
    (out / "manifest.json").unlink()
    markers = sorted((out / "_tasks").glob("*.json"))
    for marker in markers[:2]:
        marker.unlink()
    code, text = _cli("verify", out)
    assert code == 1, text
    assert "ok: " not in text and text.count("error: ") == 1  # (said "ok: N shards match", then the error)
    assert f"the run is not complete: 2 of its {clean['tasks']} tasks have not finished (no marker); the " in text
    assert "match the task markers" in text
    assert _cli("finalize", out)[0] != 0  # (finalize agrees)
    for damaged, says in (("[]", "is not a manifest of mlm-pipeline (no shards"),
                          ("{}", "is not a manifest of mlm-pipeline (no shards"), ('{"shards": [', "cannot parse")):
        (out / "manifest.json").write_text(damaged)
        for command in ("verify", "inspect", "report"):
            code, text = _cli(command, out)
            assert code == 2 and says in text and f"finalize {out} --force" in text, (command, damaged, text)
    assert _cli("finalize", out, "--force")[0] != 0  # (tasks are still missing)
    (out / "manifest.json").write_text('{"shards": []}')
    code, text = _cli("report", out)
    assert code == 2 and "is not a manifest of mlm-pipeline (no totals)" in text, text
