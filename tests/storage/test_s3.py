"""Input and output on a real S3 server (SeaweedFS; moto for ACLs), through the one fsspec layer.

Same bytes as a local run; a run killed mid-way leaves only complete shards and markers, and the
rerun completes it without redoing finished tasks; objects are private; credentials never appear
in logs, markers or the manifest.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest_servers import SECRET_KEY, s3_env, subprocess_env
from helpers_run import INPUTS, SETTINGS, VOCAB, comparable, make_config, read_manifest

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def s3_inputs(seaweedfs) -> list[str]:
    prefix = seaweedfs.new_prefix("inputs")
    client = seaweedfs.client()
    urls = []
    for path in INPUTS:
        key = prefix.split("/", 3)[3] + "/" + Path(path).name
        client.put_object(Bucket=seaweedfs.bucket, Key=key, Body=Path(path).read_bytes())
        urls.append(f"s3://{seaweedfs.bucket}/{key}")
    return urls  # the local inputs' names: the same URL order, so the same plan


def _object(server, url: str) -> bytes:
    bucket, key = url[len("s3://"):].split("/", 1)
    return server.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def _cli(inputs, output, *extra) -> list[str]:
    return [sys.executable, "-m", "mlm_pipeline.cli", "-v", "prepare", *inputs, "-o", output, "-t", VOCAB,
            "--no-progress", "--split-size", SETTINGS["split_bytes"], "--block-size", SETTINGS["block_bytes"],
            "--max-instances-per-shard", str(SETTINGS["max_instances_per_shard"]), *extra]


def test_s3_input_and_output_equal_local_run(seaweedfs, s3_inputs, local_baseline):
    from mlm_pipeline.pipeline import run_prepare

    out = seaweedfs.new_prefix("out")
    with s3_env(seaweedfs):
        manifest = run_prepare(make_config(s3_inputs, out, workers=2), show_progress=False)
    assert comparable(manifest) == comparable(local_baseline)
    keys = seaweedfs.keys(out)
    shard_keys = sorted(s["path"] for s in manifest["shards"])
    assert [k for k in keys if k.startswith("shards/")] == shard_keys
    assert sorted(k for k in keys if not k.startswith(("shards/", "_tasks/"))) == ["README.md", "_plan.json", "_run.json",
                                                                                   "manifest.json"]  # (the dataset card)
    assert len([k for k in keys if k.startswith("_tasks/")]) == manifest["tasks"]
    for s in manifest["shards"]:
        assert _object(seaweedfs, f"{out}/{s['path']}") == (local_baseline["_dir"] / s["path"]).read_bytes()
    assert [f["path"] for f in manifest["inputs"]] == sorted(s3_inputs)  # read in URL order


def test_killed_run_on_s3_leaves_only_complete_objects_and_resumes(seaweedfs, s3_inputs, local_baseline):
    out = seaweedfs.new_prefix("resume")
    env = subprocess_env(seaweedfs.env())
    # the HF backend (same bytes, a runtime setting) keeps the run slow enough to be killed midway
    proc = subprocess.Popen(_cli(s3_inputs, out, "--workers", "1", "--tokenizer-backend", "hf"), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not any(k.startswith("_tasks/") for k in seaweedfs.keys(out)):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    _, first_err = proc.communicate()
    keys = seaweedfs.keys(out)
    markers = [k for k in keys if k.startswith("_tasks/")]
    assert 0 < len(markers) < local_baseline["tasks"]
    assert "manifest.json" not in keys
    expected = {s["path"]: s for s in local_baseline["shards"]}
    for key in (k for k in keys if k.startswith("shards/")):  # every visible shard is whole
        assert key in expected
        assert _object(seaweedfs, f"{out}/{key}") == (local_baseline["_dir"] / key).read_bytes()
    for key in markers:  # and every marker's shards are there
        marker = json.loads(_object(seaweedfs, f"{out}/{key}"))
        assert all(s["path"] in keys for s in marker["shards"])
    etags_before = {k: seaweedfs.client().head_object(Bucket=seaweedfs.bucket, Key=out.split("/", 3)[3] + "/" + k)["ETag"]
                    for k in markers}

    rerun = subprocess.run(_cli(s3_inputs, out), env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"resuming: {len(markers)} of {local_baseline['tasks']} tasks already complete" in rerun.stderr
    with s3_env(seaweedfs):
        manifest = read_manifest(out)
    assert comparable(manifest) == comparable(local_baseline)
    for k, etag in etags_before.items():  # finished tasks were not redone
        assert seaweedfs.client().head_object(Bucket=seaweedfs.bucket, Key=out.split("/", 3)[3] + "/" + k)["ETag"] == etag
    # credentials are in no log line and no object we wrote
    for text in (first_err, rerun.stderr, rerun.stdout):
        assert SECRET_KEY not in text
    for key in seaweedfs.keys(out):
        if key.endswith(".json"):
            assert SECRET_KEY.encode() not in _object(seaweedfs, f"{out}/{key}")


def test_s3_endpoint_flag_instead_of_environment(seaweedfs, s3_inputs, tmp_path):
    """--s3-endpoint-url works without AWS_ENDPOINT_URL; output may be local while input is on S3."""
    env = subprocess_env({k: v for k, v in seaweedfs.env().items() if k != "AWS_ENDPOINT_URL"})
    env.pop("AWS_ENDPOINT_URL", None)
    result = subprocess.run(_cli(s3_inputs[1:], str(tmp_path / "out"), "--s3-endpoint-url", seaweedfs.endpoint),
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["totals"]["instances"] > 0
    assert "s3_endpoint_url" not in json.dumps(manifest)


def test_objects_are_private(moto_s3, tmp_path):
    """No ACL is ever set: every object keeps the private default (owner only)."""
    from mlm_pipeline.pipeline import run_prepare

    out = moto_s3.new_prefix("acl")
    with s3_env(moto_s3):
        run_prepare(make_config(INPUTS[1:], out), show_progress=False)
    client = moto_s3.client()
    keys = moto_s3.keys(out)
    assert "manifest.json" in keys
    for key in keys:
        grants = client.get_object_acl(Bucket=moto_s3.bucket, Key=out.split("/", 3)[3] + "/" + key)["Grants"]
        assert [g["Permission"] for g in grants] == ["FULL_CONTROL"]
        assert all(g["Grantee"].get("Type") == "CanonicalUser" for g in grants)


def test_an_object_rewritten_with_the_same_size_is_refused_on_resume(seaweedfs, tmp_path):
    """Objects are fingerprinted by the ETag their listing gives (no HEAD per object): an input
    object rewritten in place, same size, other bytes, is refused when the run resumes."""
    from mlm_pipeline import fs
    from mlm_pipeline.errors import OutputError
    from mlm_pipeline.executors.base import run_one
    from mlm_pipeline.pipeline import run_prepare
    from mlm_pipeline.run.state import start_run

    prefix = seaweedfs.new_prefix("edited")
    bucket, key = prefix[len("s3://"):].split("/", 1)
    client = seaweedfs.client()
    data = Path(INPUTS[0]).read_bytes()
    client.put_object(Bucket=bucket, Key=key + "/a.txt", Body=data)
    url = f"{prefix}/a.txt"
    with s3_env(seaweedfs):
        config = make_config([url], str(tmp_path / "out"), workers=1)
        start = start_run(config)
        assert fs._LISTED[url].get("ETag")  # the listing carried the version
        run_one(start.pending[0], config)  # one task completed, as in a run killed early
        edited = bytearray(data)
        edited[5] = ord("Q") if edited[5] != ord("Q") else ord("R")
        client.put_object(Bucket=bucket, Key=key + "/a.txt", Body=bytes(edited))
        with pytest.raises(OutputError, match="input bytes of completed tasks changed"):
            run_prepare(config, show_progress=False)


def test_hidden_objects_and_prefixes_under_an_input_prefix_are_not_inputs(seaweedfs):
    from mlm_pipeline import fs

    prefix = seaweedfs.new_prefix("hidden")
    bucket, key = prefix[len("s3://"):].split("/", 1)
    client = seaweedfs.client()
    for name in ("a.txt", "sub/b.txt", ".notes.txt", ".git/HEAD", "sub/.cache/c.txt"):
        client.put_object(Bucket=bucket, Key=f"{key}/{name}", Body=b"One sentence here.\n")
    with s3_env(seaweedfs):
        listed = [url for url, _ in fs.list_inputs([prefix])]
    assert listed == [f"{prefix}/a.txt", f"{prefix}/sub/b.txt"]


def test_uploads_left_by_a_killed_process_are_aborted(seaweedfs, s3_inputs):
    """s3fs uploads a shard of 100 MiB or more in parts; a process killed mid-upload leaves its
    parts stored (invisible to listings, billed) until the upload is aborted: a run does so at
    its start and end, and the worker that writes the manifest aborts those older than a stall."""
    from mlm_pipeline.formats.sink import abort_stale_uploads
    from mlm_pipeline.pipeline import run_prepare

    out = seaweedfs.new_prefix("mpu")
    client, key = seaweedfs.client(), out.split("/", 3)[3]

    def left(prefix: str = key) -> list[str]:
        return [u["Key"] for u in client.list_multipart_uploads(Bucket=seaweedfs.bucket, Prefix=prefix + "/")
                .get("Uploads", [])]

    for name in ("shards/part-00000-00000.tfrecord", "pretrain_tfrecords/pretrain_data.tfrecord-0-of-2"):
        upload = client.create_multipart_upload(Bucket=seaweedfs.bucket, Key=f"{key}/{name}")
        client.upload_part(Bucket=seaweedfs.bucket, Key=f"{key}/{name}", UploadId=upload["UploadId"], PartNumber=1,
                           Body=b"x" * (5 << 20))
    elsewhere = client.create_multipart_upload(Bucket=seaweedfs.bucket, Key=f"{key}-other/data.bin")
    assert len(left()) == 2
    with s3_env(seaweedfs):
        assert abort_stale_uploads(out, older_than=3600) == 0  # (younger than an hour: a live straggler's, kept)
        run_prepare(make_config(s3_inputs, out, workers=1), show_progress=False)
    assert left() == [] and left(f"{key}-other") == [f"{key}-other/data.bin"]  # (only the output's own)
    client.abort_multipart_upload(Bucket=seaweedfs.bucket, Key=f"{key}-other/data.bin", UploadId=elsewhere["UploadId"])
