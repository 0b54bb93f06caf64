"""A checkpoint given to ``train --resume`` is loaded as tensors and plain data only: one carrying
pickled code is refused, and its code never runs."""

from __future__ import annotations

import pytest


class _RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):  # unpickling this would create the marker file
        return (open, (self.marker, "w"))


def test_a_checkpoint_with_pickled_code_is_refused_without_running_it(clean_run, tmp_path):
    torch = pytest.importorskip("torch")
    from typer.testing import CliRunner

    from faults.conftest import _CLEAN
    from mlm_pipeline.cli import app

    clean_run("parquet")
    out = _CLEAN["parquet"][1]
    marker = tmp_path / "code-ran"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "extra": _RunsCode(str(marker))}, evil)
    result = CliRunner().invoke(app, ["train", str(out), "--steps", "1", "--batch-size", "4", "--hidden", "16",
                                      "--heads", "2", "--layers", "1", "--resume", str(evil), "-o",
                                      str(tmp_path / "train")])
    assert result.exit_code == 2, result.output
    assert f"{evil}: not a checkpoint that loads as plain tensors and data" in result.output
    assert not marker.exists()
