"""The checkpoints of ``mlm-pipeline train``: what they hold beside Lightning's state, loading one
given to ``--resume`` safely, and whose checkpoints an output directory holds.

- Random state: a checkpoint holds the generators' state (torch's, which dropout draws from;
  numpy's and Python's), put back before a resumed run's first step, so its losses are an
  uninterrupted run's. The collator's masks and the data order need none: they are hashes of
  (seed, epoch, sample).
- SIGTERM: Lightning ends ``fit`` after the step under way; :func:`checkpoint_on_sigterm_callback`
  saves ``step=N.ckpt`` then, and :class:`TrainingTerminated` tells the command, which prints
  :func:`resume_command` and exits 143.
- ``--resume``: loaded as tensors and plain data only (no pickled code runs); a missing, damaged
  or foreign file is one ``ValueError`` naming it, and the checkpoint a user likely meant.
"""

from __future__ import annotations

import csv
import math
import os
import random
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mlm_pipeline.errors import Terminated

if TYPE_CHECKING:
    from mlm_pipeline.torch.train import TrainConfig


def random_state() -> dict:
    """The state of the generators a training step may draw from (torch's: dropout; numpy's and
    Python's: a user's code), as tensors and plain data (a checkpoint is loaded ``weights_only``)."""
    import numpy as np

    _, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": gauss_next},
    }


def set_random_state(state: dict) -> None:
    """Undo :func:`random_state`."""
    import numpy as np

    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["internal"].tolist()), py["gauss_next"]))


def random_state_callback():
    import pytorch_lightning as pl

    class RandomState(pl.Callback):
        """Puts the generators' state in every checkpoint, and back before a resumed run's first step.

        Restored there, not on load: what runs between (building the data iterator, Lightning's
        setup) differs between a resumed run and an uninterrupted one, and the step's dropout
        draws must not.
        """

        def __init__(self):
            self.pending: dict | None = None

        def state_dict(self) -> dict:
            return random_state()

        def load_state_dict(self, state_dict: dict) -> None:
            self.pending = state_dict

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self.pending is not None:
                set_random_state(self.pending)
                self.pending = None

    return RandomState()


def resume_command(params, values: dict, checkpoint: Path) -> str:
    """``mlm-pipeline train`` again, from ``checkpoint``: ``params`` are the command's (click)
    parameters, ``values`` what this run was given; every option given a value other than its
    default is repeated but ``--resume`` (replaced) and ``--overwrite-output-dir`` (a run that
    continues its own checkpoints needs it not)."""
    words = ["mlm-pipeline", "train"]
    for param in params:
        value = values.get(param.name)
        if param.param_type_name == "argument":
            words.append(str(value))
        elif param.name in ("resume", "overwrite_output_dir") or value is None or value == param.default:
            continue
        elif getattr(param, "is_flag", False):
            if value or param.secondary_opts:
                words.append(param.opts[0] if value else param.secondary_opts[0])
        else:
            words += [param.opts[0], str(value)]
    return shlex.join([*words, "--resume", str(checkpoint)])


class TrainingTerminated(Terminated):
    """SIGTERM stopped training; ``checkpoint`` holds the state after ``step`` (of ``steps``)."""

    def __init__(self, checkpoint: Path, step: int, steps: int):
        super().__init__(f"terminated (SIGTERM) at step {step} of {steps}: saved {checkpoint}")
        self.checkpoint, self.step, self.steps = checkpoint, step, steps


def checkpoint_on_sigterm_callback(folder: Path):
    import pytorch_lightning as pl
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    class CheckpointOnSigterm(pl.Callback):
        """Lightning ends ``fit`` after the step under way when SIGTERM arrives (as a ``SystemExit``
        with no code: the process exited 0, as if it had finished); this saves ``step=N.ckpt``."""

        def __init__(self):
            self.saved: Path | None = None

        def on_exception(self, trainer, pl_module, exception):
            if isinstance(exception, SIGTERMException):
                folder.mkdir(parents=True, exist_ok=True)
                path = folder / f"step={trainer.global_step}.ckpt"
                trainer.save_checkpoint(path)
                self.saved = path

    return CheckpointOnSigterm()


_ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip file


def load_checkpoint(path: str) -> dict:
    """A checkpoint's tensors and plain data, never its pickled objects (``weights_only``): a
    checkpoint from elsewhere cannot run code. ``ValueError`` naming the file otherwise: another
    kind of file, or a damaged checkpoint (cut short by a full disk or a copy)."""
    import pickle

    try:
        with open(path, "rb") as f:
            head = f.read(len(_ZIP_MAGIC))
    except OSError as exc:
        raise ValueError(f"--resume {path}: cannot read it ({exc.strerror or exc})") from None
    if head != _ZIP_MAGIC:
        if _ZIP_MAGIC.startswith(head):  # empty, or cut within its first bytes
            raise ValueError(_damaged(path, f"{len(head)} bytes"))
        raise ValueError(f"--resume {path}: not a checkpoint (a PyTorch checkpoint is a zip file); give a "
                         "checkpoints/*.ckpt file written by mlm-pipeline train")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path}: not a checkpoint that loads as plain tensors and data ({first}); "
                         "only checkpoints written by mlm-pipeline train are resumed") from None
    except Exception as exc:  # a cut or corrupted zip: RuntimeError, OSError (EINVAL), EOFError, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(_damaged(path, f"{type(exc).__name__}: {first[:200]}")) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ValueError(f"{path}: not a checkpoint of mlm-pipeline train (no state_dict)")
    return checkpoint


def _damaged(path: str, detail: str) -> str:
    """The error for a checkpoint that does not read to its end, naming an earlier one beside it."""
    others = [p for p in checkpoints_in([Path(path).parent]) if not os.path.samefile(p, path)]
    instead = f"; the latest other checkpoint there is {max(others, key=step_of)}" if others else ""
    return (f"--resume {path}: the checkpoint is damaged (truncated or corrupted; {detail}): resume from "
            f"another checkpoint{instead}")


def checkpoints_in(folders: list[Path]) -> list[Path]:
    """The ``*.ckpt`` files of these folders (each once), by step (``last.ckpt`` last)."""
    found = {p.resolve(): p for folder in folders if folder.is_dir() for p in folder.glob("*.ckpt") if p.is_file()}
    return sorted(found.values(), key=lambda p: (step_of(p), p.name))


def no_checkpoint_at(resume: str, output_dir: str) -> str:
    """The error for a ``--resume`` that is no file, naming the checkpoint the user likely means: a
    run stopped before its end (killed, pre-empted) has ``step=N.ckpt`` files but no ``last.ckpt``."""
    given = Path(resume)
    folders = [given, given / "checkpoints"] if given.is_dir() else [given.parent]
    found = checkpoints_in([*folders, Path(output_dir) / "checkpoints"])
    what = "a directory" if given.is_dir() else "no such file"
    if not found:
        return f"no checkpoint at {resume} ({what})"
    latest = found[-1]
    return (f"no checkpoint at {resume} ({what}); the latest checkpoint in {latest.parent} is {latest.name} "
            f"(a run stopped before its end has no last.ckpt): continue it with --resume {latest}")


def step_of(checkpoint: Path) -> float:
    """The step in a ``step=N.ckpt`` name; infinity for ``last.ckpt`` and any other name."""
    found = re.fullmatch(r"step=(\d+)\.ckpt", checkpoint.name)
    return int(found.group(1)) if found else math.inf


@dataclass
class OutputDir:
    """What ``output_dir`` holds of runs other than this one, found before anything is written.

    A run writes ``checkpoints/step=N.ckpt``, ``last.ckpt``, ``loss.csv``, ``summary.json`` and
    ``model/``; another run's checkpoints beside this run's would pass for them. ``continues``:
    ``resume`` is a checkpoint of this directory (the run goes on from its step); then only the
    checkpoints written after that step are another's (a branch it leaves), else every one.
    """

    path: Path
    continues: bool
    resume_step: int | None
    others: list[Path]

    @classmethod
    def of(cls, config: TrainConfig, resume_step: int | None) -> "OutputDir":
        path = Path(config.output_dir)
        folder = path / "checkpoints"
        resume = Path(config.resume) if config.resume else None
        continues = resume is not None and resume.absolute().parent.resolve() == folder.resolve()
        checkpoints = sorted(folder.glob("*.ckpt"), key=lambda p: (step_of(p), p.name))
        others = [p for p in checkpoints if not (resume is not None and os.path.samefile(p, resume))
                  and not (continues and step_of(p) <= resume_step)]
        return cls(path, continues, resume_step, others)

    def refusal(self, config: TrainConfig) -> str | None:
        """Why this run may not write here, if it may not (without ``overwrite_output_dir``)."""
        if not self.others or config.overwrite_output_dir:
            return None
        names = ", ".join(p.name for p in self.others[:3]) + (f" and {len(self.others) - 3} more" if len(self.others) > 3 else "")
        if self.continues:
            return (f"{self.path} holds checkpoints written after step {self.resume_step}, the step --resume "
                    f"{config.resume} goes back to ({names}): they would pass for this run's; replace them, and "
                    f"the loss rows after step {self.resume_step}, with --overwrite-output-dir, or train into another "
                    "--output-dir")
        if config.resume:
            return (f"{self.path} holds the checkpoints of another run ({names}), which would pass for this run's: "
                    "train into another --output-dir, or replace that run with --overwrite-output-dir")
        return (f"{self.path} holds the checkpoints of an earlier run ({names}): continue it with --resume "
                f"{self.others[-1]}, train into another --output-dir, or replace it with --overwrite-output-dir")

    def clear(self) -> None:
        """Just before training: the other runs' checkpoints (``overwrite_output_dir``) and what
        they left; the loss log starts anew, or, when continuing, keeps the rows up to the step."""
        for checkpoint in self.others:
            checkpoint.unlink()
        if self.others:
            (self.path / "summary.json").unlink(missing_ok=True)
            shutil.rmtree(self.path / "model", ignore_errors=True)
        log = self.path / "loss.csv"
        if not log.exists():
            return
        if not self.continues:
            log.unlink()
            return
        with open(log, newline="") as f:
            rows = list(csv.DictReader(f))
        with open(log, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["step"])
            writer.writeheader()
            writer.writerows(r for r in rows if int(r["step"]) <= self.resume_step)
