"""A fast tokenizer backend used in the driver (its load-time self-check, and real text) does not
hang the workers that encode with it afterwards: forked and spawned local pool workers, and Ray
workers. Each run is a fresh driver process under a time limit; a hang fails the test."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import pytest

from helpers_run import INPUTS, REPO

_DRIVER = """
import json, os, sys, threading, time
mode, tokenizer, out = sys.argv[1:4]
if mode == "spawn":  # a thread of the driver's own: the pool spawns its workers
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
threads_at_fork = []
def native_threads():
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
os.register_at_fork(before=lambda: threads_at_fork.append(native_threads()))
sys.path.insert(0, sys.argv[4])
from helpers_run import INPUTS, make_config
from mlm_pipeline.executors import local
from mlm_pipeline.pipeline import run_prepare
from mlm_pipeline.tokenize import load_tokenizer

tok = load_tokenizer(tokenizer)  # the self-check runs here, in the driver
assert tok.encoder.name == "fastokens", tok.backend_info
lines = [s for s in open(INPUTS[0], encoding="utf-8").read().splitlines() if s.strip()]
tok.encode_batch(lines)  # and the driver encodes real text with it, in one big batch
methods = []
start_pool = local.TaskPool._start_pool
def recording(self):
    start_pool(self)
    methods.append(self.start_method)
local.TaskPool._start_pool = recording
executor = {"executor": "ray"} if mode == "ray" else {}
manifest = run_prepare(make_config(INPUTS, out, tokenizer=tokenizer, workers=2, **executor))
print(json.dumps({"methods": methods, "fork_threads": threads_at_fork[:1],
                  "backends": manifest["tokenizer_backend"], "tasks": manifest["tasks"],
                  "shards": [[s["path"], s["sha256"]] for s in manifest["shards"]]}))
"""


def _drive(mode: str, roberta_bpe, out, env: dict | None = None, timeout: float = 240) -> dict:
    env = {**(env or os.environ), "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])}
    env.pop("FASTOKENS_BPE_THREADS", None)  # the backend's own setting, not the environment's
    done = subprocess.run([sys.executable, "-c", _DRIVER, mode, str(roberta_bpe), str(out), str(REPO / "tests")],
                          capture_output=True, text=True, env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _one_worker(roberta_bpe, out) -> list:
    from helpers_run import make_config
    from mlm_pipeline.pipeline import run_prepare
    from mlm_pipeline.tokenize import load_tokenizer

    load_tokenizer.cache_clear()
    try:
        manifest = run_prepare(make_config(INPUTS, out, tokenizer=str(roberta_bpe)), show_progress=False)
    finally:
        load_tokenizer.cache_clear()
    return [[s["path"], s["sha256"]] for s in manifest["shards"]]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork, and threads read from /proc")
def test_forked_and_spawned_pool_workers_encode_with_the_backend_the_driver_used(roberta_bpe, tmp_path):
    pytest.importorskip("fastokens")
    want = _one_worker(roberta_bpe, tmp_path / "one")
    for mode in ("fork", "spawn"):
        seen = _drive(mode, roberta_bpe, tmp_path / mode)
        assert seen["methods"] == [mode]
        if mode == "fork":  # the driver had no fastokens thread when it forked (nor any other)
            assert not any(name.startswith("fastokens") for name in seen["fork_threads"][0]), seen["fork_threads"]
        # every task ran in a worker, with the fast backend, to the one-worker run's bytes
        assert [(b["backend"], b["tasks"]) for b in seen["backends"]] == [("fastokens", seen["tasks"])]
        assert seen["tasks"] > 2 and seen["shards"] == want


@pytest.mark.ray
def test_ray_workers_encode_with_the_backend_the_driver_used(roberta_bpe, tmp_path):
    """A private local Ray instance (two CPUs) started by the driver after it used the backend."""
    pytest.importorskip("fastokens")
    # (not imported here: Ray reads its settings, RAY_AUTH_MODE among them, when it is first
    # imported, and the test process's later Ray cluster fixture sets them first)
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed")
    want = _one_worker(roberta_bpe, tmp_path / "one")
    ray_tmp = tempfile.mkdtemp(prefix="mlr", dir="/tmp")  # short: Ray's socket paths have a length limit
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("RAY_ADDRESS", None)
    try:
        seen = _drive("ray", roberta_bpe, tmp_path / "ray", env, timeout=420)
    finally:
        import shutil

        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert seen["methods"] == []  # no local pool: Ray's workers ran the tasks
    assert [(b["backend"], b["tasks"]) for b in seen["backends"]] == [("fastokens", seen["tasks"])]
    assert seen["tasks"] > 2 and seen["shards"] == want
