"""The names and paths of a run's directory: the only module that spells them.

::

    OUTPUT/_run.json                 the run record: settings, tokenizer and plan fingerprints (first)
    OUTPUT/_plan.json                the tasks and input files (``finalize`` works from the output alone)
    OUTPUT/_tasks/TASK.json          a task's completion marker: its shards and stats (written last)
    OUTPUT/_leases/TASK.json         claim mode: which worker holds a task, until when
    OUTPUT/_tmp/TASK-RANDOM.partial  a shard being written (local outputs; cleared when a run starts and ends)
    OUTPUT/shards/part-TASK-NNNNN.EXT   committed shards (EXT: the format's extension, mostly its
                                     name; megatron's .bin has its .idx beside it)
    OUTPUT/pretrain_tfrecords/pretrain_data.tfrecord-I-of-N
                                     with --num-out-files: ELECTRA's output files instead of shards,
                                     where its pretraining glob (DATA_DIR/pretrain_tfrecords/
                                     pretrain_data.tfrecord*) finds them with --data-dir OUTPUT
    OUTPUT/manifest.json             totals and every shard (written once, at the end)
    OUTPUT/_prepare.lock             held (flock) by the one plain run working in a local output

Every other module asks here for a name or a URL, so moving or renaming any of these is one edit.

None of these is ever a symbolic link in a run's own output, and a shard named by a manifest or a
marker is always inside one of the shard directories: :func:`refuse_links` and :func:`shard_url`
hold that, so that a planted link or a crafted manifest never makes a command read, write or
delete a file outside the output.
"""

from __future__ import annotations

import os
import posixpath
import uuid

from mlm_pipeline import fs
from mlm_pipeline.errors import OutputError

RUN_FILE = "_run.json"
PLAN_FILE = "_plan.json"
MANIFEST_FILE = "manifest.json"
LOCK_FILE = "_prepare.lock"
TASKS_DIR = "_tasks"
LEASES_DIR = "_leases"
TMP_DIR = "_tmp"
LANGUAGE_COUNTS_DIR = "_language_counts"  # --language-alpha: each task's tokens per language
SHARDS_DIR = "shards"
SHARD_PREFIX = "part-"
OUT_FILES_DIR = "pretrain_tfrecords"
OUT_FILE_PREFIX = "pretrain_data.tfrecord"

_PER_TASK_SUFFIX = ".json"  # markers and leases: one JSON object per task, named by the task id
_PARTIAL_SUFFIX = ".partial"


def run_url(output: str) -> str:
    return fs.join(output, RUN_FILE)


def plan_url(output: str) -> str:
    return fs.join(output, PLAN_FILE)


def lock_path(output_path: str) -> str:
    """The lock file of a local output (a local path)."""
    return f"{output_path.rstrip('/')}/{LOCK_FILE}"


def manifest_url(output: str) -> str:
    return fs.join(output, MANIFEST_FILE)


def tasks_url(output: str) -> str:
    """The directory of completion markers."""
    return fs.join(output, TASKS_DIR)


def marker_url(output: str, task_id: str) -> str:
    return fs.join(output, TASKS_DIR, task_id + _PER_TASK_SUFFIX)


def language_counts_url(output: str, task_id: str) -> str:
    """A task's input tokens per language (the counting pass of ``--language-alpha``)."""
    return fs.join(output, LANGUAGE_COUNTS_DIR, task_id + _PER_TASK_SUFFIX)


def leases_url(output: str) -> str:
    """The directory of claim-mode leases."""
    return fs.join(output, LEASES_DIR)


def lease_url(output: str, task_id: str) -> str:
    return fs.join(output, LEASES_DIR, task_id + _PER_TASK_SUFFIX)


def task_id_of(name: str) -> str | None:
    """The task id a marker or lease file is named after (``00003.json`` -> ``00003``; a path's
    last component counts); None for any other file."""
    base = name.rstrip("/").rsplit("/", 1)[-1]
    if not base.endswith(_PER_TASK_SUFFIX) or base.startswith("."):
        return None
    return base[: -len(_PER_TASK_SUFFIX)]


def shards_url(output: str) -> str:
    """The directory of committed shards."""
    return fs.join(output, SHARDS_DIR)


def shard_name(task_id: str, k: int, fmt: str) -> str:
    """The file name of a task's ``k``-th shard; ``fmt``: its format's extension, without the dot
    (:attr:`~mlm_pipeline.formats.OutputFormat.extension`)."""
    return f"{SHARD_PREFIX}{task_id}-{k:05d}.{fmt}"


def shard_glob(extension: str) -> str:
    """A glob, relative to the output, of every committed shard with ``extension`` (its dot
    included) and nothing else there (a dataset card's ``data_files``)."""
    return f"{SHARDS_DIR}/{SHARD_PREFIX}*{extension}"


def out_files_glob() -> str:
    """A glob, relative to the output, of every ELECTRA-named output file."""
    return f"{OUT_FILES_DIR}/{OUT_FILE_PREFIX}-*"


def shard_path(name: str) -> str:
    """A shard's path relative to the output, as markers and the manifest record it."""
    return f"{SHARDS_DIR}/{name}"


def companion_name(name: str, extension: str) -> str:
    """The name of a shard's companion file: the shard's name with its extension replaced
    (``part-00003-00000.bin`` -> ``part-00003-00000.idx``, Megatron's pair)."""
    return f"{name.rsplit('.', 1)[0]}{extension}"


def shard_files(entry: dict) -> list[dict]:
    """A shard's manifest (or marker) entry and its companions' (``path``, ``bytes``, ``sha256``):
    every file a shard is, for the checks that a shard is whole."""
    return [entry, *entry.get("companions", ())]


def out_files_url(output: str) -> str:
    """The directory of ELECTRA-named output files (``--num-out-files``)."""
    return fs.join(output, OUT_FILES_DIR)


def out_file_name(index: int, num_out_files: int) -> str:
    """ELECTRA's name of output file ``index`` of ``num_out_files`` (not zero-padded)."""
    return f"{OUT_FILE_PREFIX}-{index}-of-{num_out_files}"


def out_file_path(name: str) -> str:
    """An output file's path relative to the output, as markers and the manifest record it."""
    return f"{OUT_FILES_DIR}/{name}"


def shard_url(output: str, path: str) -> str:
    """The URL of a shard that a manifest or marker records as ``path``, relative to the output.

    Refuses (:class:`OutputError`) a path that would leave the output's shard directories: an
    absolute path, a URL, ``..``, or a local shard that is a symbolic link. A manifest is data
    anyone may have edited; ``inspect``, ``verify`` and the loader read only the run's own shards.
    """
    parts = path.split("/")
    if ("://" in path or path.startswith("/") or "\\" in path or len(parts) != 2
            or parts[0] not in (SHARDS_DIR, OUT_FILES_DIR) or parts[1] in ("", ".", "..")):
        raise OutputError(f"{manifest_url(output)} names a shard outside the output: {path!r} (a run records its "
                          f"shards as {SHARDS_DIR}/NAME or {OUT_FILES_DIR}/NAME); refusing to read it")
    url = fs.join(output, path)
    if fs.is_local(output) and os.path.islink(fs.get_fs(url)[1]):
        raise OutputError(f"shard {path} in {output} is a symbolic link: a run's shards never are; refusing to "
                          "read what it points to")
    return url


def refuse_a_file(output: str) -> None:
    """:class:`OutputError` when a local ``output`` is a file, not an output directory (instead of
    the "Not a directory" of reading a name inside it), or holds a link where its layout names a
    file (:func:`refuse_links`)."""
    if fs.is_local(output) and os.path.isfile(fs.get_fs(output)[1]):
        raise OutputError(f"{output} is a file: expected the output directory of a prepare run (the one holding "
                          f"{MANIFEST_FILE} and {RUN_FILE})")
    refuse_links(output)


LAYOUT_NAMES = (RUN_FILE, PLAN_FILE, MANIFEST_FILE, LOCK_FILE, TASKS_DIR, LEASES_DIR, TMP_DIR, SHARDS_DIR, OUT_FILES_DIR,
                LANGUAGE_COUNTS_DIR)
"""Every name a run keeps in its output directory."""


def refuse_links(output: str) -> None:
    """:class:`OutputError` when a local output holds a symbolic link where its layout names a
    file or directory (``_prepare.lock``, ``_tmp``, ``manifest.json``…): a run never makes one,
    and following it would let the run overwrite, delete or read files outside the output (a link
    at ``_prepare.lock`` had its target truncated; one at ``_tmp`` had its target's files deleted
    by the cleanup). Object stores have no links."""
    if not fs.is_local(output):
        return
    directory = fs.get_fs(output)[1]
    links = [name for name in LAYOUT_NAMES if os.path.islink(posixpath.join(directory, name))]
    if links:
        named = ", ".join(posixpath.join(output.rstrip("/"), name) for name in links)
        raise OutputError(f"{named} {'is a symbolic link' if len(links) == 1 else 'are symbolic links'}: a run's own "
                          "files are never links, and following one would read, write or delete files outside the "
                          "output; remove the link, or give another --output")


def shard_dir_urls(output: str) -> list[str]:
    """Every directory that can hold a run's committed shards or output files."""
    return [shards_url(output), out_files_url(output)]


def tmp_dir(output_path: str) -> str:
    """Where a local output's shards are written before they are committed (a local path)."""
    return f"{output_path.rstrip('/')}/{TMP_DIR}"


def tmp_shard_name(task_id: str) -> str:
    """A fresh name for a shard being written (unique, so retries and racing workers never clash)."""
    return f"{task_id}-{uuid.uuid4().hex}{_PARTIAL_SUFFIX}"


__all__ = [
    "LEASES_DIR", "LOCK_FILE", "MANIFEST_FILE", "OUT_FILES_DIR", "OUT_FILE_PREFIX", "PLAN_FILE", "RUN_FILE", "SHARDS_DIR",
    "SHARD_PREFIX", "TASKS_DIR", "TMP_DIR", "lease_url", "leases_url", "lock_path", "manifest_url", "marker_url", "out_file_name", "out_file_path", "out_files_url", "plan_url", "run_url",
    "LANGUAGE_COUNTS_DIR", "language_counts_url",
    "LAYOUT_NAMES", "companion_name", "shard_files", "refuse_a_file", "refuse_links", "shard_dir_urls", "shard_url",
    "out_files_glob", "shard_glob", "shard_name", "shard_path", "shards_url", "task_id_of", "tasks_url", "tmp_dir", "tmp_shard_name",
]
