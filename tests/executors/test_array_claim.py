"""Array and claim modes: separate worker processes racing on one S3 prefix (SeaweedFS, moto).

Every shard is produced exactly once, the output equals a local run, the manifest is written once,
and a worker killed while holding a lease has its task taken over after the lease expires.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from conftest_servers import s3_env, subprocess_env
from helpers_run import INPUTS, REPO, SAMPLE, SETTINGS, VOCAB, comparable, make_config, read_manifest


@pytest.fixture(scope="module")
def local_baseline(tmp_path_factory):
    from mlm_pipeline.pipeline import run_prepare

    out = tmp_path_factory.mktemp("local")
    return run_prepare(make_config(INPUTS, out), show_progress=False)


def _cmd(output: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mlm_pipeline.cli", "prepare", *INPUTS, "-o", output, "-t", VOCAB,
            "--no-progress", "--workers", "1", "--split-size", SETTINGS["split_bytes"],
            "--block-size", SETTINGS["block_bytes"],
            "--max-instances-per-shard", str(SETTINGS["max_instances_per_shard"]), *extra]


def _run_workers(cmds: list[list[str]], env: dict, timeout: float = 240) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    results = []
    for p, c in zip(procs, cmds):
        out, err = p.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(c, p.returncode, out, err))
    return results


def _claimed(stderr: str) -> list[str]:
    return re.findall(r"task (\d+): claimed by", stderr)


@pytest.mark.s3
def test_claim_workers_race_on_one_prefix(seaweedfs, local_baseline):
    """(moto honours the same conditional headers: tests/storage/test_cas.py races on both.)"""
    s3 = seaweedfs
    out = s3.new_prefix("claim")
    results = _run_workers([_cmd(out, "--claim", "--lease-seconds", "20")] * 3, subprocess_env(s3.env()))
    for r in results:
        assert r.returncode == 0, r.stderr
    claims = Counter(t for r in results for t in _claimed(r.stderr))
    assert sorted(claims) == [f"{i:05d}" for i in range(local_baseline["tasks"])]
    assert set(claims.values()) == {1}, claims  # each task run exactly once
    assert sum("wrote manifest.json" in r.stdout for r in results) == 1
    with s3_env(s3):
        manifest = read_manifest(out)
    assert comparable(manifest) == comparable(local_baseline)
    keys = s3.keys(out)
    assert not [k for k in keys if k.startswith("_leases/")]  # every lease released
    assert sorted(k for k in keys if k.startswith("shards/")) == sorted(s["path"] for s in manifest["shards"])


@pytest.mark.s3
def test_worker_killed_holding_a_lease_is_taken_over(seaweedfs, local_baseline):
    out = seaweedfs.new_prefix("takeover")
    env = subprocess_env(seaweedfs.env())
    lease = 3
    doomed = subprocess.Popen(_cmd(out, "--claim", "--lease-seconds", str(lease)), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # killed the moment it logs its first claim: the lease is written by then, and the task (the
    # process's first, which also loads the tokenizer) has barely started. Watching the listing
    # instead raced a fast worker: all 12 tasks could finish between two listings.
    seen = []
    watchdog = threading.Timer(120, doomed.kill)  # a worker that never claims ends the loop below
    watchdog.start()
    try:
        for line in doomed.stderr:
            seen.append(line)
            if _claimed(line):
                doomed.send_signal(signal.SIGKILL)  # dies holding the lease of a task in progress
                break
        doomed.communicate()
    finally:
        watchdog.cancel()
    claims = _claimed("".join(seen))
    assert len(claims) == 1 and doomed.returncode == -signal.SIGKILL, "".join(seen)
    (claimed,) = claims
    orphan = [k for k in seaweedfs.keys(out) if k.startswith("_leases/")]
    assert len(orphan) == 1
    orphan_task = orphan[0].split("/")[1][: -len(".json")]
    assert orphan_task == claimed and f"_tasks/{claimed}.json" not in seaweedfs.keys(out)
    killed_at = time.time()

    (rescuer,) = _run_workers([_cmd(out, "--claim", "--lease-seconds", str(lease))], env)
    assert rescuer.returncode == 0, rescuer.stderr
    assert re.search(rf"task {orphan_task}: took over the expired lease of \S+", rescuer.stderr), rescuer.stderr
    assert time.time() - killed_at >= lease  # not before the lease expired
    assert "wrote manifest.json" in rescuer.stdout
    with s3_env(seaweedfs):
        manifest = read_manifest(out)
    assert comparable(manifest) == comparable(local_baseline)
    assert not [k for k in seaweedfs.keys(out) if k.startswith("_leases/")]


@pytest.mark.s3
def test_array_workers_split_the_tasks_and_the_last_writes_the_manifest(seaweedfs, local_baseline):
    out = seaweedfs.new_prefix("array")
    env = subprocess_env(seaweedfs.env())
    # rank 2 of 3 first and alone: its share only, no manifest yet; finalize refuses
    (first,) = _run_workers([_cmd(out, "--task-rank", "2", "--task-count", "3")], env)
    assert first.returncode == 0, first.stderr
    expected_2 = [f"{i:05d}" for i in range(local_baseline["tasks"]) if i % 3 == 2]
    assert sorted(k[len("_tasks/"):-5] for k in seaweedfs.keys(out) if k.startswith("_tasks/")) == expected_2
    assert "manifest.json" not in seaweedfs.keys(out)
    from mlm_pipeline.errors import IncompleteRun
    from mlm_pipeline.run.manifest import finalize

    with s3_env(seaweedfs), pytest.raises(IncompleteRun) as missing:
        finalize(out)
    assert sorted(missing.value.missing) == sorted(set(f"{i:05d}" for i in range(local_baseline["tasks"])) - set(expected_2))
    # ranks 0 and 1 (from Slurm's variables for one of them) together
    slurm = {**env, "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "3"}
    procs = [subprocess.Popen(_cmd(out, "--task-rank", "0", "--task-count", "3"), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True),
             subprocess.Popen(_cmd(out), env=slurm, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert "array mode: worker 1 of 3" in outs[1][1]
    assert sum("wrote manifest.json" in o for o, _ in outs) == 1
    with s3_env(seaweedfs):
        manifest = read_manifest(out)
    assert comparable(manifest) == comparable(local_baseline)
    with s3_env(seaweedfs):
        again, wrote = finalize(out)
    assert not wrote and comparable(again) == comparable(local_baseline)


def test_claim_on_a_local_directory(tmp_path, local_baseline):
    """Three claim workers on a shared local directory (leases by link + flock)."""
    out = str(tmp_path / "out")
    results = _run_workers([_cmd(out, "--claim", "--lease-seconds", "20")] * 3, subprocess_env())
    for r in results:
        assert r.returncode == 0, r.stderr
    claims = Counter(t for r in results for t in _claimed(r.stderr))
    assert len(claims) == local_baseline["tasks"] and set(claims.values()) == {1}
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert comparable(manifest) == comparable(local_baseline)
    # every lease released with its lock file, no temporary file left
    left = [p.name for p in (tmp_path / "out").rglob("*") if p.name.endswith(".lock") or ".tmp-" in p.name]
    assert left == []
    assert not (tmp_path / "out" / "_tmp").exists()  # removed by the worker that wrote the manifest


def test_finalize_rewrites_a_local_manifest_from_markers(tmp_path, local_baseline):
    from mlm_pipeline.run.manifest import finalize
    from mlm_pipeline.pipeline import run_prepare

    out = tmp_path / "out"
    run_prepare(make_config(INPUTS, out), show_progress=False)
    (out / "manifest.json").unlink()
    manifest, wrote = finalize(str(out))
    assert wrote and comparable(manifest) == comparable(local_baseline)
    again, wrote = finalize(str(out))
    assert not wrote and comparable(again) == comparable(local_baseline)


@pytest.mark.parametrize(
    "flags, env, expected",
    [
        ((None, None), {}, (None, None)),
        ((1, 4), {}, (1, 4)),
        ((None, 4), {"JOB_COMPLETION_INDEX": "3"}, (3, 4)),
        ((None, None), {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "5", "SLURM_ARRAY_TASK_COUNT": "3"}, (2, 3)),
        ((0, None), {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "8"}, (0, 8)),
    ],
)
def test_array_rank_and_count_from_flags_and_environment(flags, env, expected):
    from mlm_pipeline.executors.array import array_from_env

    assert array_from_env(*flags, environ=env) == expected


@pytest.mark.parametrize("flags, env", [((2, None), {}), ((None, 3), {}), ((None, 3), {"JOB_COMPLETION_INDEX": "x"})])
def test_array_settings_errors(flags, env):
    from mlm_pipeline.executors.array import array_from_env

    with pytest.raises(ValueError):
        array_from_env(*flags, environ=env)


def test_config_refuses_inconsistent_scale_out_settings(tmp_path):
    from mlm_pipeline.config import ConfigError

    for bad in ({"task_rank": 3, "task_count": 3}, {"claim": True, "task_rank": 0, "task_count": 2},
                {"claim": True, "executor": "ray"}, {"task_rank": 1}):
        with pytest.raises(ConfigError):
            make_config(INPUTS, tmp_path, **bad)
    # none of them changes the output fingerprint
    base = make_config(INPUTS, tmp_path)
    assert make_config(INPUTS, tmp_path, claim=True, lease_seconds=5, s3_endpoint_url="http://x").output_fingerprint() \
        == base.output_fingerprint()


def test_finalize_command_exit_codes(tmp_path):
    from typer.testing import CliRunner

    from mlm_pipeline.cli import app

    out = tmp_path / "out"
    runner = CliRunner()
    args = ["prepare", *INPUTS, "-o", str(out), "-t", VOCAB, "--no-progress", "--workers", "1",
            "--split-size", SETTINGS["split_bytes"], "--task-rank", "0", "--task-count", "2"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "array worker 0/2" in first.output and "still running" in first.output
    incomplete = runner.invoke(app, ["finalize", str(out)])
    assert incomplete.exit_code == 1 and "not complete yet" in incomplete.output
    second = runner.invoke(app, args[:-4] + ["--task-rank", "1", "--task-count", "2"])
    assert second.exit_code == 0 and "wrote manifest.json" in second.output
    again = runner.invoke(app, ["finalize", str(out)])
    assert again.exit_code == 0 and "already exists" in again.output
    forced = runner.invoke(app, ["finalize", str(out), "--force"])
    assert forced.exit_code == 0 and "already exists" not in forced.output


@pytest.mark.parametrize("mode", ["claim", "array"])
def test_a_marker_rejected_at_the_end_is_redone_not_left_without_a_manifest(tmp_path, local_baseline, monkeypatch,
                                                                             mode):
    """A shard lost after its task (deleted, damaged) makes its marker stale. A worker that found a
    marker for every task stopped there and exited 0 with no manifest, so VM groups deleted
    themselves with the run incomplete; it now runs that task again and writes the manifest. A
    worker that still cannot (a marker it cannot read) exits 1, so a group's script runs it again."""
    import typer

    from mlm_pipeline import pipeline
    from mlm_pipeline.cli import _echo_worker_summary
    from mlm_pipeline.run.manifest import finalize_if_complete
    from mlm_pipeline.run.state import done_task_ids

    out = tmp_path / "out"
    lost = []

    def losing_a_shard(config, record, plan):
        if not lost and len(done_task_ids(config.output)) == len(plan.tasks):
            lost.append(sorted((out / "shards").iterdir())[0])
            lost[0].unlink()
        return finalize_if_complete(config, record, plan)

    monkeypatch.setattr(pipeline, "finalize_if_complete", losing_a_shard)
    scale = {"claim": True} if mode == "claim" else {"task_rank": 0, "task_count": 1}
    summary = pipeline.run_prepare(make_config(INPUTS, out, **scale), show_progress=False)
    assert lost and summary["manifest"] is not None, summary
    assert comparable(summary["manifest"]) == comparable(local_baseline)
    assert len(summary["ran"]) == local_baseline["tasks"] + 1  # (the lost shard's task, twice)
    with pytest.raises(typer.Exit) as stopped:  # every marker there, no manifest: not a success
        _echo_worker_summary(dict(summary, manifest=None, manifest_exists=False))
    assert stopped.value.exit_code == 1


def test_the_worker_that_sees_the_last_marker_come_writes_the_manifest(tmp_path, local_baseline, monkeypatch):
    """Two array workers ending together: one finds a task unmarked (the other's last, in flight),
    and when it looks again every marker is there but no manifest yet. It writes the manifest
    itself (a conditional create: one worker's wins); it exited 1 as if the run were broken."""
    from mlm_pipeline import pipeline
    from mlm_pipeline.executors.base import run_one
    from mlm_pipeline.run.manifest import finalize_if_complete

    out = tmp_path / "out"
    other = make_config(INPUTS, out, task_rank=1, task_count=2)
    pipeline.run_prepare(other, show_progress=False)  # rank 1's tasks, all but its last done...
    last = max((t for t in pipeline.start_run(other, clean=False).plan.tasks if t.index % 2 == 1), key=lambda t: t.index)
    (out / "_tasks" / f"{last.task_id}.json").unlink()
    calls = []

    def the_other_ends_now(config, record, plan):
        found = finalize_if_complete(config, record, plan)
        calls.append(found)
        if len(calls) == len([t for t in plan.tasks if t.index % 2 == 0]) + 1:  # after this worker's loop
            run_one(last, other)  # ...and it ends while this worker looks
        return found

    monkeypatch.setattr(pipeline, "finalize_if_complete", the_other_ends_now)
    summary = pipeline.run_prepare(make_config(INPUTS, out, task_rank=0, task_count=2), show_progress=False)
    assert summary["manifest"] is not None and comparable(summary["manifest"]) == comparable(local_baseline)


def test_a_worker_that_saw_a_task_running_exits_0_when_its_marker_lands_before_the_summary(tmp_path, local_baseline,
                                                                                           monkeypatch):
    """Two array ranks ending together: rank 0 looks once more after its tasks and finds rank 1's
    last task unmarked (still running), so rank 1, which writes that marker, writes the manifest.
    Rank 1's marker lands right after that look, before rank 0 reports. Rank 0 counted the tasks
    again for its report, found every marker but no manifest yet (rank 1 was writing it) and exited
    1, as for a broken run: the full suite's array test failed so. The report now says what the
    look that decided saw."""
    import typer

    from mlm_pipeline import pipeline
    from mlm_pipeline.cli import _echo_worker_summary
    from mlm_pipeline.executors.base import run_one
    from mlm_pipeline.run.manifest import finalize_if_complete
    from mlm_pipeline.run.state import done_task_ids

    out = tmp_path / "out"
    other = make_config(INPUTS, out, task_rank=1, task_count=2)
    pipeline.run_prepare(other, show_progress=False)  # rank 1's tasks, all but its last done...
    start = pipeline.start_run(other, clean=False)
    last = max((t for t in start.plan.tasks if t.index % 2 == 1), key=lambda t: t.index)
    (out / "_tasks" / f"{last.task_id}.json").unlink()
    landed = []

    def its_marker_lands_after_the_look(output):
        names = done_task_ids(output)
        if last.task_id not in names and not landed:  # the look that finds it running, after rank 0's tasks
            landed.append(run_one(last, other))  # ...and rank 1 writes its marker now, not the manifest yet
        return names

    monkeypatch.setattr(pipeline, "done_task_ids", its_marker_lands_after_the_look)
    summary = pipeline.run_prepare(make_config(INPUTS, out, task_rank=0, task_count=2), show_progress=False)
    assert landed and summary["manifest"] is None
    try:
        _echo_worker_summary(summary)
    except typer.Exit as stopped:
        pytest.fail(f"rank 0 exited {stopped.exit_code} while rank 1 was writing the manifest: {summary}")
    assert summary["tasks_done"] == summary["tasks_total"] - 1 and not summary["manifest_exists"]
    # rank 1 then looks after its last task, as its loop does: every marker, so it writes the manifest
    manifest = finalize_if_complete(other, start.record, start.plan)
    assert manifest is not None and comparable(manifest) == comparable(local_baseline)


RANK_SERVER = """
import contextlib, io, json, logging, sys, time, traceback
import typer
sys.path.insert(0, sys.argv[1])
from helpers_run import make_config
from mlm_pipeline.cli import _echo_worker_summary
from mlm_pipeline.pipeline import run_prepare
logging.disable(logging.WARNING)
print("ready", flush=True)
for line in sys.stdin:  # OUTPUT RANK DELAY INPUT...: one round, answered by one JSON line
    out, rank, delay, *inputs = line.split()
    time.sleep(float(delay))
    code, wrote, said = 0, False, io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            summary = run_prepare(make_config(inputs, out, task_rank=int(rank), task_count=2), show_progress=False)
            wrote = summary["manifest"] is not None
            _echo_worker_summary(summary)
    except typer.Exit as exc:
        code = exc.exit_code
    except BaseException:
        code = 3
        said.write(traceback.format_exc())
    print(json.dumps({"code": code, "wrote": wrote, "said": said.getvalue()}), flush=True)
"""

STRESS_ROUNDS = 50


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_two_array_ranks_ending_together_many_times_under_cpu_load(tmp_path, request, storage):
    """Two array ranks of one task each, equal in size, started together round after round (one of
    them up to 20 ms later, to sweep the moment they end) while a third process burns a CPU: each
    round both exit 0 and exactly one writes the manifest. The ranks are two long-lived processes
    (the imports and the tokenizer are loaded once), so a round costs its two tasks only."""
    from conftest_servers import stop_process

    from mlm_pipeline import fs

    text = (SAMPLE / "wikitext2-train-1MB.txt").read_bytes()
    inputs = []
    for i in range(2):  # two tasks of about 60 KB each (two files: more than one task's split size), whole lines
        start = text.index(b"\n", 60_000 * i) + 1 if i else 0
        end = text.index(b"\n", 60_000 * (i + 1)) + 1
        inputs.append(tmp_path / f"part-{i}.txt")
        inputs[-1].write_bytes(text[start:end])
    if storage == "s3":
        s3 = request.getfixturevalue("seaweedfs")
        env, prefix = subprocess_env(s3.env()), s3.new_prefix("stress")
    else:
        env, prefix = subprocess_env(), str(tmp_path)
    ranks = [subprocess.Popen([sys.executable, "-c", RANK_SERVER, str(REPO / "tests")], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
             for _ in range(2)]
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    rng = random.Random(31)
    failures = []
    try:
        for r in ranks:
            assert r.stdout.readline().strip() == "ready"
        for n in range(STRESS_ROUNDS):
            out = f"{prefix}/out-{n}"
            late = rng.randrange(2)
            for rank, r in enumerate(ranks):
                delay = rng.uniform(0, 0.02) if rank == late else 0.0
                r.stdin.write(f"{out} {rank} {delay:.4f} {' '.join(map(str, inputs))}\n")
                r.stdin.flush()
            results = [json.loads(r.stdout.readline()) for r in ranks]
            if [r["code"] for r in results] != [0, 0] or sum(r["wrote"] for r in results) != 1:
                failures.append((n, results))
                continue
            with s3_env(s3) if storage == "s3" else contextlib.nullcontext():
                assert json.loads(fs.read_bytes(f"{out}/manifest.json"))["tasks"] == 2
            if storage == "local":
                assert not os.path.exists(f"{out}/_tmp")
    finally:
        stop_process(burner)
        for r in ranks:
            r.stdin.close()
            stop_process(r)
    assert not failures, f"{len(failures)} of {STRESS_ROUNDS} rounds failed; the first: {failures[0]}"
