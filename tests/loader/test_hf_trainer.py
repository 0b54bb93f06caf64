"""The Hugging Face Trainer over MLMDataset and its collator: DDP on CPU, resume mid-epoch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from loader.loader_helpers import REPO  # noqa: E402

pytestmark = [pytest.mark.torch]


def test_trainer_under_torchrun_resumes_mid_epoch_with_the_same_batches(short_out, tmp_path):
    """2 processes (gloo): 6 steps, then again from the step-3 checkpoint in the same processes.
    The processes' batches are disjoint, and the resumed steps 4-6 are the uninterrupted ones."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(REPO / "examples" / "hf_trainer.py"), short_out, str(tmp_path / "run"), "--max-steps", "6",
           "--save-steps", "3", "--batch-size", "8", "--hidden", "32", "--layers", "1",
           "--record", str(tmp_path / "record"), "--check-resume", "3"]
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / "record" / f"rank{r}.json").read_text()) for r in (0, 1)]
    seen = []
    for rec in ranks:
        first, resumed = rec["first"], rec["resumed"]
        assert first["first_step"] == 1 and len(first["steps"]) == 6
        assert all(len(step) == 8 for step in first["steps"])
        assert resumed["first_step"] == 4
        assert resumed["steps"] == first["steps"][3:]  # same samples, same order, after the resume
        seen += [i for step in first["steps"] for i in step]
    assert len(seen) == len(set(seen)) == 96  # the two processes share the epoch out: no sample twice
