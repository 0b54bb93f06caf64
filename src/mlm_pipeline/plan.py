"""Plan: from input paths to a list of tasks, before any data is processed.

The planner lists files and their sizes and cuts big uncompressed files into nominal byte ranges
(readers align each range on document boundaries, so the planner never reads the data); small
files are grouped so that a task is roughly ``split_bytes`` of input (by default a size derived
from the total input, ``auto_split_bytes``). Task ids and seeds come from the plan order alone —
never from worker count or scheduling — so any executor reproduces the same shards.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

import numpy as np

from mlm_pipeline import fs
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.read.base import InputError, Piece, detect_format, sniff
from mlm_pipeline.read.ranges import split_file


@dataclass(frozen=True)
class Task:
    task_id: str
    index: int
    pieces: tuple[Piece, ...]
    input_bytes: int

    def seed_sequence(self, random_seed: int, *extra: int) -> np.random.SeedSequence:
        """Seed from (global seed, task index[, block index...]) only."""
        return np.random.SeedSequence(random_seed, spawn_key=(self.index, *extra))

    def describe(self) -> str:
        return "; ".join(p.describe() for p in self.pieces)

    def to_dict(self) -> dict:
        return {"task_id": self.task_id, "pieces": [asdict(p) for p in self.pieces], "input_bytes": self.input_bytes}


MIB = 1 << 20
AUTO_TASKS = 32
AUTO_MIN_BYTES = 1 * MIB
AUTO_MAX_BYTES = 64 * MIB


def auto_split_bytes(total_bytes: int) -> int:
    """Task size when none is set: the input cut in ``AUTO_TASKS`` (32) tasks, rounded up to a
    whole MiB, kept within 1 MiB and 64 MiB.

    A fixed 64 MiB made any input under 64 MiB one task, run by one worker however many there
    were; 32 tasks keep a pool or a small cluster busy to the end, while 1 MiB keeps a task (and
    its blocks, where random-next segments are drawn) large, and 64 MiB bounds what a lost task
    costs on a big corpus. It depends on the input only, never on the worker count.
    """
    per_task = -(-max(total_bytes, 1) // AUTO_TASKS)
    return min(AUTO_MAX_BYTES, max(AUTO_MIN_BYTES, -(-per_task // MIB) * MIB))


@dataclass
class Plan:
    tasks: list[Task]
    files: list[dict]
    skipped_files: list[dict] = field(default_factory=list)
    split_bytes: int = 0  # the task size used (set or auto)

    def fingerprint(self) -> str:
        blob = json.dumps([t.to_dict() for t in self.tasks], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    @property
    def input_bytes(self) -> int:
        return sum(t.input_bytes for t in self.tasks)


def _piece_bytes(piece: Piece, size: int, n_pieces: int) -> int:
    if piece.fmt == "parquet":
        return max(1, size // max(1, n_pieces))
    end = size if piece.end is None else piece.end
    return max(0, end - piece.start)


def plan_tasks(config: PrepareConfig) -> Plan:
    """Tasks for the configured inputs. Raises ``InputError`` for inputs that cannot be used."""
    urls = fs.expand_inputs(config.inputs)
    usable: list[tuple[str, int, str]] = []
    skipped: list[dict] = []
    for url in urls:
        try:
            size = fs.file_size(url)
        except (OSError, PermissionError) as exc:
            raise InputError(f"cannot read {url}: {exc}") from exc
        if size == 0:
            skipped.append({"path": url, "reason": "empty_file"})
            continue
        try:
            reason = sniff(url)
        except PermissionError as exc:
            raise InputError(f"cannot read {url}: permission denied") from exc
        except OSError as exc:
            raise InputError(f"cannot read {url}: {exc}") from exc
        if reason:
            skipped.append({"path": url, "reason": "binary", "detail": reason})
            continue
        fmt = detect_format(url) if config.input_format == "auto" else config.input_format
        usable.append((url, size, fmt))

    split_bytes = config.split_bytes or auto_split_bytes(sum(size for _, size, _ in usable))
    files: list[dict] = []
    pieces: list[tuple[Piece, int]] = []
    for url, size, fmt in usable:
        # reference mode reads each file whole, like the reference script
        file_pieces = split_file(url, fmt, size, size if config.reference else split_bytes)
        files.append({"path": url, "bytes": size, "format": fmt, "pieces": len(file_pieces)})
        for p in file_pieces:
            pieces.append((p, _piece_bytes(p, size, len(file_pieces))))

    tasks: list[Task] = []
    group: list[Piece] = []
    group_bytes = 0

    def flush() -> None:
        nonlocal group, group_bytes
        if group:
            idx = len(tasks)
            tasks.append(Task(task_id=f"{idx:05d}", index=idx, pieces=tuple(group), input_bytes=group_bytes))
        group, group_bytes = [], 0

    for piece, nbytes in pieces:
        if config.reference:  # the reference's unit is one file: never group
            group, group_bytes = [piece], nbytes
            flush()
            continue
        if group and group_bytes + nbytes > split_bytes:
            flush()
        group.append(piece)
        group_bytes += nbytes
    flush()
    if not tasks:
        detail = ", ".join(f"{s['path']} ({s.get('detail', s['reason'])})" for s in skipped)
        raise InputError("no usable input: every input file was skipped: " + detail)
    return Plan(tasks=tasks, files=files, skipped_files=skipped, split_bytes=split_bytes)
