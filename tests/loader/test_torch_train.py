"""Training smoke tests: a tiny BERT learns from our real shards; Lightning resumes mid-epoch."""

from __future__ import annotations

import csv
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pytorch_lightning")
pytest.importorskip("transformers")

from mlm_pipeline.torch.train import TrainConfig, main  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_loss_drops_clearly_on_the_sample_corpus(short_out, tmp_path):
    """WikiText-2 (1 MB) shards, 128-hidden 2-layer BERT, 50 steps of 16 on one CPU thread."""
    summary = main(TrainConfig(
        data=short_out, steps=50, batch_size=16, lr=2e-3, layers=2, hidden=128, heads=2, masking="dynamic",
        whole_word_mask=True, output_dir=str(tmp_path / "run"), threads=1, eval_batches=2, log_every=0,
    ))
    before, after = summary["eval_mlm_loss_before"], summary["eval_mlm_loss_after"]
    assert before > 9.5  # ~ln(30522) = 10.3 for an untrained model
    assert after < before - 2.0, summary
    assert summary["last_train_loss_mean"] < summary["first_train_loss"] - 2.0
    rows = _rows(tmp_path / "run" / "loss.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, 51))
    assert all(0 < int(r["masked_tokens"]) <= 16 * 10 for r in rows)  # ~15 % of <= 64 tokens each
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "run" / "model" / "config.json").is_file()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["model"] == "BertForPreTraining"


def test_resuming_a_checkpoint_continues_with_the_same_batches(short_out, tmp_path):
    """Checkpoint at step 3 of 6 (2 workers), resume through the CLI: steps 4-6 see the same batches."""
    from typer.testing import CliRunner

    from mlm_pipeline.cli import app

    common = dict(data=short_out, batch_size=8, layers=1, hidden=32, heads=2, threads=1, eval_batches=1,
                  log_every=0, shuffle_buffer=64, num_workers=2, masking="static")
    main(TrainConfig(**common, steps=6, save_every=3, output_dir=str(tmp_path / "a")))
    result = CliRunner().invoke(app, [
        "train", short_out, "--steps", "6", "--batch-size", "8", "--layers", "1", "--hidden", "32", "--heads", "2",
        "--threads", "1", "--shuffle-buffer", "64", "--num-workers", "2", "--masking", "static",
        "--output-dir", str(tmp_path / "b"), "--resume", str(tmp_path / "a" / "checkpoints" / "step=3.ckpt"),
    ])
    assert result.exit_code == 0, result.output
    assert "6 steps" not in result.output and "3 steps" in result.output
    full, resumed = _rows(tmp_path / "a" / "loss.csv"), _rows(tmp_path / "b" / "loss.csv")
    assert [r["step"] for r in resumed] == ["4", "5", "6"]
    assert [r["batch_crc"] for r in resumed] == [r["batch_crc"] for r in full[3:]]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in full[3:]]  # and the same dropout
    assert len({r["batch_crc"] for r in full}) == 6
    assert "callbacks used to create the checkpoint" not in result.output  # Lightning's note, not ours
    # a checkpoint of another model shape: one line, exit 2
    other = CliRunner().invoke(app, [
        "train", short_out, "--steps", "6", "--batch-size", "8", "--layers", "1", "--hidden", "64", "--heads", "2",
        "--masking", "static", "--output-dir", str(tmp_path / "c"),
        "--resume", str(tmp_path / "a" / "checkpoints" / "step=3.ckpt"),
    ])
    assert other.exit_code == 2, other.output
    assert "holds another model than these settings build" in other.output and "Traceback" not in other.output


def test_train_cli_user_errors(short_out, tmp_path):
    from typer.testing import CliRunner

    from mlm_pipeline.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["train", short_out, "--hidden", "30", "--heads", "4", "-o", str(tmp_path)])
    assert bad.exit_code == 2 and "multiple of heads" in bad.output
    missing = runner.invoke(app, ["train", str(tmp_path / "nothing"), "-o", str(tmp_path / "model")])
    assert missing.exit_code == 2 and f"{tmp_path / 'nothing'}: no such directory" in missing.output
    assert "manifest" not in missing.output
    (tmp_path / "empty").mkdir()
    empty = runner.invoke(app, ["train", str(tmp_path / "empty"), "-o", str(tmp_path / "model")])
    assert empty.exit_code == 2 and "no manifest.json in" in empty.output
    assert not (tmp_path / "model").exists()  # a refused run makes no output directory (it made an empty one)
    # short_out holds static masks: whole words need load-time masking, said in the command's flags
    words = runner.invoke(app, ["train", short_out, "--whole-word-mask", "-o", str(tmp_path)],
                          env={"COLUMNS": "240"})
    assert words.exit_code == 2 and "--masking auto picks static masking for this output: add --masking dynamic" in words.output


def _train_cli(args: list[str], *, tty: bool) -> str:
    """`mlm-pipeline train ARGS` in a child process, its stdout and stderr on a pseudo-terminal
    (as in a user's shell) or on a pipe (as in a log file)."""
    import os
    import pty
    import subprocess
    import sys

    from conftest_servers import subprocess_env

    cmd = [sys.executable, "-m", "mlm_pipeline.cli", "train", *args]
    if not tty:
        proc = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout + proc.stderr
    import fcntl
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # 40 rows, 120 columns
    proc = subprocess.Popen(cmd, env={**subprocess_env(), "COLUMNS": "120"}, stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=follower)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(60) == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def test_training_prints_progress_and_loss_without_lightnings_chatter(short_out, tmp_path):
    args = [short_out, "--steps", "4", "--batch-size", "4", "--layers", "1", "--hidden", "32", "--heads", "2",
            "--threads", "1", "--shuffle-buffer", "64"]
    chatter = ("Tip", "litlogger", "GPU available", "TPU available", "IterableDataset", "LeafSpec",
               "Trainer.fit", "UserWarning", "rank_zero")
    logged = _train_cli([*args, "-o", str(tmp_path / "pipe")], tty=False)
    assert not [c for c in chatter if c in logged], logged
    assert "step      1  loss" in logged and "4 steps in" in logged
    shown = _train_cli([*args, "-o", str(tmp_path / "tty")], tty=True)
    assert not [c for c in chatter if c in shown], shown
    # a progress bar (tqdm's, on the terminal) with the loss, and no loss lines under it
    assert "4/4" in shown and "loss=" in shown and "step      1  loss" not in shown, shown
    assert "4 steps in" in shown


def test_runs_directory_is_ignored_by_git(repo_root):
    """`mlm-pipeline train -o runs/...` (the example of its help) leaves nothing for git to add."""
    import subprocess

    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/tiny/loss.csv"], cwd=repo_root)
    assert ignored.returncode == 0


def test_a_resumed_run_keeps_the_epochs_of_an_uninterrupted_one(tmp_path):
    """Lightning restores its batch index with the loader's state; the loader's len is a whole
    epoch, so the resumed epoch ends where the uninterrupted run's did and the later ones keep
    their length (a length of the rest ended it early and kept that length for good)."""
    from loader.loader_helpers import prepare_output
    from mlm_pipeline.torch import MLMDataLoader, MLMDataset

    out = prepare_output(tmp_path / "out", fmt="parquet", max_seq_length=64)
    dataset = MLMDataset(out, shuffle_buffer=64, seed=0)
    epoch = len(MLMDataLoader(dataset, batch_size=128, collate_fn=dataset.collator(), num_workers=2))
    assert epoch >= 6
    common = dict(data=out, batch_size=128, layers=1, hidden=32, heads=2, threads=1, eval_batches=1, log_every=0,
                  shuffle_buffer=64, masking="static", num_workers=2, steps=2 * epoch + 3)
    main(TrainConfig(**common, save_every=epoch // 2, output_dir=str(tmp_path / "a")))
    main(TrainConfig(**common, output_dir=str(tmp_path / "b"),
                     resume=str(tmp_path / "a" / "checkpoints" / f"step={epoch // 2}.ckpt")))
    full, resumed = _rows(tmp_path / "a" / "loss.csv"), _rows(tmp_path / "b" / "loss.csv")
    assert [r["epoch"] for r in full] == ["0"] * epoch + ["1"] * epoch + ["2"] * 3
    assert [(r["step"], r["epoch"], r["batch_crc"]) for r in resumed] == [
        (r["step"], r["epoch"], r["batch_crc"]) for r in full[epoch // 2:]]


def test_a_resumed_run_has_the_losses_of_an_uninterrupted_one(tiny_out, tmp_path):
    """The checkpoints hold the random generators' state (dropout draws from torch's), restored
    before the first resumed step; starting a data pass draws from a generator of its own. So a run
    resumed mid-epoch, or at the end of an epoch (where the uninterrupted run starts its next pass
    between the two steps), has the uninterrupted run's losses, not only its batches."""
    from mlm_pipeline.torch import MLMDataLoader, MLMDataset

    dataset = MLMDataset(tiny_out, shuffle_buffer=64)
    assert len(MLMDataLoader(dataset, batch_size=10, collate_fn=dataset.collator())) == 14  # one epoch
    common = dict(data=tiny_out, batch_size=10, layers=1, hidden=16, heads=2, threads=1, eval_batches=1, log_every=0,
                  shuffle_buffer=64, masking="dynamic", steps=18)
    main(TrainConfig(**common, save_every=7, output_dir=str(tmp_path / "full")))
    full = _rows(tmp_path / "full" / "loss.csv")
    assert [r["epoch"] for r in full] == ["0"] * 14 + ["1"] * 4
    for step in (7, 14):  # mid-epoch, end of the epoch
        main(TrainConfig(**common, output_dir=str(tmp_path / f"from{step}"),
                         resume=str(tmp_path / "full" / "checkpoints" / f"step={step}.ckpt")))
        resumed = _rows(tmp_path / f"from{step}" / "loss.csv")
        assert [(r["step"], r["batch_crc"], r["loss"], r["mlm_loss"], r["nsp_loss"]) for r in resumed] == [
            (r["step"], r["batch_crc"], r["loss"], r["mlm_loss"], r["nsp_loss"]) for r in full[step:]], step


def test_a_second_run_into_one_output_dir_is_refused_or_replaces_the_first(short_out, tmp_path):
    """Another run's checkpoints would pass for this run's: a new run, a run resumed from
    elsewhere, and a run going back to an earlier step of its own directory are refused (one line,
    exit 2) and replace them with --overwrite-output-dir, only once every setting is checked;
    a run continuing from its latest checkpoint goes on, its loss log kept up to that step."""
    from typer.testing import CliRunner

    from mlm_pipeline.cli import app

    def train(out, *more):
        return CliRunner().invoke(app, [
            "train", short_out, "--batch-size", "4", "--layers", "1", "--hidden", "16", "--heads", "2", "--threads", "1",
            "--shuffle-buffer", "64", "-o", str(out), *map(str, more)], env={"COLUMNS": "400"})

    def steps(out):
        return [int(r["step"]) for r in _rows(out / "loss.csv")]

    run, other = tmp_path / "run", tmp_path / "other"
    folder = run / "checkpoints"
    assert train(run, "--steps", 4, "--save-every", 1).exit_code == 0
    assert train(other, "--steps", 2).exit_code == 0
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["last.ckpt", "step=1.ckpt", "step=2.ckpt", "step=3.ckpt", "step=4.ckpt"]
    refused = {
        "new": train(run, "--steps", 2),
        "resumed from elsewhere": train(run, "--steps", 3, "--resume", other / "checkpoints" / "last.ckpt"),
        "back to step 2": train(run, "--steps", 3, "--resume", folder / "step=2.ckpt"),
        "replacing, but another model": train(run, "--steps", 2, "--hidden", 32, "--resume",
                                              folder / "step=2.ckpt", "--overwrite-output-dir"),
    }
    for why, result in refused.items():
        assert result.exit_code == 2 and "Traceback" not in result.output, why
    assert (f"holds the checkpoints of an earlier run (step=1.ckpt, step=2.ckpt, step=3.ckpt and 2 more): continue "
            f"it with --resume {folder / 'last.ckpt'}") in refused["new"].output
    assert "holds the checkpoints of another run" in refused["resumed from elsewhere"].output
    assert ("holds checkpoints written after step 2, the step --resume" in refused["back to step 2"].output
            and "(step=3.ckpt, step=4.ckpt, last.ckpt)" in refused["back to step 2"].output)
    assert "holds another model" in refused["replacing, but another model"].output
    assert sorted(p.name for p in folder.iterdir()) == names and steps(run) == [1, 2, 3, 4]  # nothing removed
    # back to step 2, replacing the branch after it: its checkpoints and loss rows go
    back = train(run, "--steps", 3, "--save-every", 1, "--resume", folder / "step=2.ckpt", "--overwrite-output-dir")
    assert back.exit_code == 0, back.output
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "step=1.ckpt", "step=2.ckpt", "step=3.ckpt"]
    assert steps(run) == [1, 2, 3]
    # on from the latest checkpoint: nothing of another run is here
    on = train(run, "--steps", 5, "--resume", folder / "last.ckpt")
    assert on.exit_code == 0, on.output
    assert steps(run) == [1, 2, 3, 4, 5]
    replaced = train(run, "--steps", 2, "--overwrite-output-dir")
    assert replaced.exit_code == 0, replaced.output
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"] and steps(run) == [1, 2]
    assert json.loads((run / "summary.json").read_text())["final_step"] == 2
