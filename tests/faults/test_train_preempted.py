"""``mlm-pipeline train`` pre-empted: SIGTERM to the job's process group mid-training (as Slurm's
``scancel`` sends it; a DataLoader worker gets it too).

Lightning ended ``fit`` quietly and the command exited 0 with no checkpoint, ``summary.json`` or
``model/``: a pre-empted job looked finished. Now it saves ``checkpoints/step=N.ckpt``, says so
with the command that continues, exits 143, and that command finishes the run with the losses of
a run never interrupted. A ``--resume`` that is missing, damaged or no checkpoint at all gets one
line naming the file, and exit 2.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("pytorch_lightning")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

STEPS = 60
TRAIN_ARGS = ["--steps", str(STEPS), "--batch-size", "10", "--layers", "1", "--hidden", "16", "--heads", "2",
              "--threads", "1", "--num-workers", "1", "--shuffle-buffer", "64"]


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Preempted:
    data: str
    run: Path
    returncode: int
    stderr: str
    step: int  # loss rows written when the run ended
    left: list[str]  # what the output directory held then
    processes_left: bool


@pytest.fixture(scope="module")
def preempted(tmp_path_factory) -> Preempted:
    """A training run (one DataLoader worker) sent SIGTERM, in its whole process group, after 3 steps."""
    from conftest_servers import subprocess_env
    from loader.loader_helpers import prepare_tiny_output

    base = tmp_path_factory.mktemp("preempted")
    data = prepare_tiny_output(base / "data")
    run = base / "run"
    proc = subprocess.Popen([sys.executable, "-m", "mlm_pipeline.cli", "train", data, *TRAIN_ARGS, "-o", str(run)],
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    log, deadline = run / "loss.csv", time.monotonic() + 300
    while not (log.exists() and len(_rows(log)) >= 3):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"training did not reach step 3 (exit {proc.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    for _ in range(100):  # the worker, ended by the training process on its way out
        if not _group_alive(proc.pid):
            break
        time.sleep(0.1)
    processes_left = _group_alive(proc.pid)
    if processes_left:
        os.killpg(proc.pid, signal.SIGKILL)
    return Preempted(data, run, proc.returncode, stderr, len(_rows(log)), sorted(os.listdir(run)), processes_left)


def test_sigterm_saves_a_checkpoint_says_so_and_exits_143(preempted):
    p = preempted
    checkpoint = p.run / "checkpoints" / f"step={p.step}.ckpt"
    assert p.returncode == 143, p.stderr[-3000:]
    assert 3 <= p.step < STEPS
    assert (f"terminated (SIGTERM) at step {p.step} of {STEPS}: saved {checkpoint}; continue with:\n"
            f"  mlm-pipeline train {p.data} ") in p.stderr, p.stderr[-3000:]
    assert f" --resume {checkpoint}\n" in p.stderr and "Traceback" not in p.stderr
    assert checkpoint.is_file()
    assert p.left == ["checkpoints", "loss.csv"]  # no summary.json, no model/: the run has not finished
    assert not p.processes_left


def test_the_printed_command_resumes_with_the_losses_of_an_uninterrupted_run(preempted, tmp_path, tally):
    """The checkpoint holds the data position and the random generators' state: the resumed run's
    loss rows (and batches) are those of a run never stopped, step for step."""
    from typer.testing import CliRunner

    from mlm_pipeline.cli import app
    from mlm_pipeline.torch.train import TrainConfig, main

    p = preempted
    if p.returncode != 143:
        pytest.skip("the run was not pre-empted (see the test above)")
    command = p.stderr.split("continue with:\n", 1)[1].strip().splitlines()[0]
    words = shlex.split(command)
    assert words[:2] == ["mlm-pipeline", "train"]
    resumed = CliRunner().invoke(app, words[1:])
    assert resumed.exit_code == 0, resumed.output
    assert f"{STEPS - p.step} steps in" in resumed.output
    main(TrainConfig(data=p.data, steps=STEPS, batch_size=10, layers=1, hidden=16, heads=2, threads=1, num_workers=1,
                     shuffle_buffer=64, output_dir=str(tmp_path / "full"), log_every=0))
    columns = ("step", "epoch", "batch_crc", "loss", "mlm_loss", "nsp_loss")
    full = [tuple(r[c] for c in columns) for r in _rows(tmp_path / "full" / "loss.csv")]
    assert [tuple(r[c] for c in columns) for r in _rows(p.run / "loss.csv")] == full
    assert [r[1] for r in full][-1] == "4"  # (the run crosses epochs: 14 steps each)
    assert json.loads((p.run / "summary.json").read_text())["final_step"] == STEPS
    assert (p.run / "model" / "config.json").is_file()
    tally.record("train pre-empted by SIGTERM, resumed from its checkpoint")


def test_a_missing_damaged_or_foreign_resume_checkpoint_is_named(tmp_path):
    """After a kill there is no last.ckpt: the error names the step=N.ckpt that is there. A cut
    checkpoint (a full disk) is called damaged, and a file of another kind no checkpoint; one line,
    exit 2, no traceback."""
    from typer.testing import CliRunner

    from loader.loader_helpers import prepare_tiny_output
    from mlm_pipeline.cli import app
    from mlm_pipeline.torch.train import TrainConfig, main

    data = prepare_tiny_output(tmp_path / "data")
    run = tmp_path / "run"
    main(TrainConfig(data=data, steps=2, batch_size=10, layers=1, hidden=16, heads=2, threads=1, shuffle_buffer=64,
                     save_every=1, eval_batches=0, log_every=0, output_dir=str(run)))
    folder = run / "checkpoints"
    (folder / "last.ckpt").unlink()  # as a run killed after step 2 leaves it
    kept = folder / "step=2.ckpt"
    cut = tmp_path / "cut.ckpt"
    whole = kept.read_bytes()
    cut.write_bytes(whole[: len(whole) // 2])
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")

    def train(resume: Path):
        result = CliRunner().invoke(app, ["train", data, *TRAIN_ARGS, "-o", str(run), "--resume", str(resume)])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        return result.output

    assert (f"no checkpoint at {folder / 'last.ckpt'} (no such file); the latest checkpoint in {folder} is "
            f"step=2.ckpt (a run stopped before its end has no last.ckpt): continue it with --resume {kept}"
            ) in train(folder / "last.ckpt")
    assert f"--resume {cut}: the checkpoint is damaged (truncated or corrupted;" in train(cut)
    assert f"--resume {text}: not a checkpoint" in train(text)
