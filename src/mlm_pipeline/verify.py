"""Check shards against what their run recorded: present, of the recorded size, of the recorded SHA-256.

Every shard's size and SHA-256 are recorded in its task's marker and in ``manifest.json`` when it
is committed. ``mlm-pipeline verify OUTPUT`` (:func:`verify_output`) checks every shard of a
complete run against the manifest (or, before the manifest exists, against the markers) and names
each bad one; the torch loader checks each shard it opens (:func:`check_shard`), and a resumed
``prepare`` compares sizes before it trusts a completed task.

A size check costs one metadata request; a SHA-256 check reads the shard once.
"""

from __future__ import annotations

import hashlib
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from mlm_pipeline import fs
from mlm_pipeline.errors import InspectError
from mlm_pipeline.run import layout

log = logging.getLogger("mlm_pipeline")

__all__ = ["CHECKS", "ShardProblem", "VerifyResult", "check_shard", "file_sha256", "forget_bad_tasks", "verify_output"]

CHECKS = ("sha256", "size", "none")
"""How thoroughly a shard is checked: its SHA-256 (reads it), its size only, or not at all."""

_CHUNK = 8 << 20


def file_sha256(url: str) -> str:
    """The SHA-256 of a file (local path or fsspec URL), read in 8 MiB chunks."""
    digest = hashlib.sha256()
    with fs.open_url(url, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)


def check_shard(url: str, *, size: int | None, sha256: str | None, check: str = "sha256") -> str | None:
    """What is wrong with the shard at ``url`` compared with its recorded ``size`` and ``sha256``;
    None if nothing (or if ``check`` is ``none``, or nothing was recorded)."""
    if check not in CHECKS:
        raise ValueError(f"check must be one of {', '.join(CHECKS)}, got {check!r}")
    if check == "none":
        return None
    try:
        actual = fs.file_size(url)
    except FileNotFoundError:
        return "missing"
    if size is not None and actual != size:
        return f"{actual} bytes, the run recorded {size}" + (" (truncated)" if actual < size else "")
    if check == "sha256" and sha256:
        got = file_sha256(url)
        if got != sha256:
            return f"sha256 {got[:16]}..., the run recorded {sha256[:16]}... (content changed)"
    return None


@dataclass(frozen=True)
class ShardProblem:
    path: str  # as the manifest records it (relative to the output)
    problem: str


@dataclass
class VerifyResult:
    output: str
    checked: int = 0
    bytes_checked: int = 0
    problems: list[ShardProblem] = field(default_factory=list)
    source: str = layout.MANIFEST_FILE
    tasks: int | None = None  # before the manifest: the run's tasks, and how many have a marker
    tasks_done: int | None = None

    @property
    def ok(self) -> bool:
        """Every recorded shard is whole (see :attr:`complete` for whether the run is)."""
        return not self.problems

    @property
    def complete(self) -> bool:
        """The run finished every task (its manifest exists, or every task has its marker)."""
        return self.tasks is None or (self.tasks_done or 0) >= self.tasks


def _recorded_shards(output: str) -> tuple[list[dict], str, tuple[int, int] | None]:
    """The shards a run recorded: the manifest's, else (a run not finalized) its markers', with
    (the run's tasks, the markers found)."""
    from mlm_pipeline.run.manifest import read_manifest

    layout.refuse_a_file(output)
    manifest_url = layout.manifest_url(output)
    if fs.exists(manifest_url):
        return read_manifest(output)["shards"], layout.MANIFEST_FILE, None
    if not fs.exists(layout.run_url(output)):
        raise InspectError(f"{output} holds no run of mlm-pipeline prepare (no {layout.MANIFEST_FILE}, "
                           f"no {layout.RUN_FILE})")
    try:
        tasks = int(json.loads(fs.read_bytes(layout.run_url(output)))["tasks"])
    except (ValueError, KeyError, TypeError):
        tasks = None
    shards = []
    markers = _markers(output)
    for url, marker in markers:
        if marker is _NOT_READ:
            shards.append({"path": url, "bytes": None, "sha256": None, "unreadable_marker": "cannot be read"})
        elif marker is None:
            shards.append({"path": url, "bytes": None, "sha256": None, "unreadable_marker": "is damaged"})
        else:
            shards.extend(marker["shards"])
    counts = None if tasks is None else (tasks, len(markers))
    return shards, f"the task markers in {layout.TASKS_DIR}/ (no {layout.MANIFEST_FILE} yet)", counts


_NOT_READ: dict = {}  # a marker that could not be fetched (a storage error): nothing tells it is bad


def _markers(output: str) -> list[tuple[str, dict | None]]:
    """(URL, content) of every task marker of the output; content None when it is not a marker
    (damaged), :data:`_NOT_READ` when it could not be read."""
    ids = (layout.task_id_of(p) for p in fs.listdir(layout.tasks_url(output)))
    urls = [layout.marker_url(output, i) for i in sorted(i for i in ids if i is not None)]
    found = []
    for url, data in zip(urls, fs.read_many(urls)):
        if data is None:
            found.append((url, _NOT_READ))
            continue
        try:
            marker = json.loads(data)
            found.append((url, marker if isinstance(marker, dict) and "shards" in marker else None))
        except (json.JSONDecodeError, UnicodeDecodeError):
            found.append((url, None))
    return found


def forget_bad_tasks(output: str, result: VerifyResult) -> list[str]:
    """Make the tasks whose shards ``result`` found bad count as not done: delete their markers
    (and ``manifest.json``, which lists their shards), so that running the same ``prepare``
    again redoes exactly those tasks, rewriting the same bytes. Returns the task ids."""
    bad = {p.path for p in result.problems}
    forgotten = []
    for url, marker in _markers(output):  # (read again: what is there now decides)
        if marker is _NOT_READ:
            log.warning("%s cannot be read now: kept (run verify --repair again)", url)
            continue
        if marker is None or bad & {f["path"] for s in marker["shards"] for f in layout.shard_files(s)}:
            fs.remove(url)
            forgotten.append(layout.task_id_of(url))
    if forgotten:
        fs.remove(layout.manifest_url(output))
    return forgotten


def verify_output(output: str, *, check: str = "sha256", threads: int = 4) -> VerifyResult:
    """Check every shard of the run in ``output``; the result lists each bad shard and why."""
    shards, source, counts = _recorded_shards(output)
    result = VerifyResult(output=output, source=source)
    if counts is not None:
        result.tasks, result.tasks_done = counts

    def one(entry: dict) -> tuple[dict, str | None]:
        if entry.get("unreadable_marker"):
            return entry, f"task marker {entry['unreadable_marker']}"
        url = layout.shard_url(output, entry["path"])
        return entry, check_shard(url, size=entry.get("bytes"), sha256=entry.get("sha256"), check=check)

    # every file of every shard (Megatron's .idx beside its .bin); a shard counts once
    files = [(f, k == 0) for entry in shards for k, f in enumerate(layout.shard_files(entry))]
    with ThreadPoolExecutor(max(1, threads)) as pool:
        for (entry, problem), shard in zip(pool.map(one, (f for f, _ in files)), (s for _, s in files)):
            result.checked += shard
            if problem is None:
                result.bytes_checked += int(entry.get("bytes") or 0)
            else:
                result.problems.append(ShardProblem(entry["path"], problem))
    return result
