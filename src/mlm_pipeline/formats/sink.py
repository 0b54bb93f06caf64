"""Shard files of any output format: stream blocks into a temporary file, then commit it atomically.

The one place that handles a shard's life, whatever its format: a shard is first written to a
temporary local file (inside ``OUTPUT/_tmp/`` for local outputs, so the final ``os.replace`` stays
on one filesystem; a system temp dir for object stores, then one upload, which appears only once
complete), hashed (SHA-256) while it is written, then committed under its final name. Nothing
named like a shard exists until it is whole. The format (from the registry) only encodes.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import logging
import os
import shutil
import socket
import stat
import tempfile
import time

import numpy as np

from mlm_pipeline import fs
from mlm_pipeline.errors import ConfigError
from mlm_pipeline.formats import OutputFormat, get_output_format
from mlm_pipeline.instances.batch import InstanceBatch
from mlm_pipeline.run import layout

log = logging.getLogger("mlm_pipeline")


def open_in_tmp(path: str, mode: str):
    """Open a file in ``_tmp/``, making the directory again if it is gone: the worker that wrote a
    shared run's manifest removes it when empty (:func:`tidy_tmp`), while another worker
    may still be running a task taken over from it."""
    try:
        return open(path, mode)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, mode)


class HashingFile(io.RawIOBase):
    """A local file opened for writing that computes its SHA-256 as the bytes go through, so a
    finished shard need not be read back to be hashed for the manifest."""

    def __init__(self, path: str):
        super().__init__()
        self._path = path
        self._f = open_in_tmp(path, "wb")
        self._sha256 = hashlib.sha256()
        self._position = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._sha256.update(data)
        try:
            written = self._f.write(data)
        except OSError as exc:  # a full disk's error names no file: this one
            raise fs.naming(exc, self._path)
        self._position += written
        return written

    def tell(self) -> int:
        return self._position

    def hexdigest(self) -> str:
        return self._sha256.hexdigest()

    def close(self) -> None:
        if not self.closed:
            try:
                self._f.close()  # (flushes)
            except OSError as exc:
                raise fs.naming(exc, self._path)
            finally:
                super().close()




def commit_file(local_tmp: str, dest_url: str) -> None:
    """Move a finished local file to its final URL, atomically."""
    if fs.is_local(dest_url):
        _, dest = fs.get_fs(dest_url)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.replace(local_tmp, dest)
    else:
        filesystem, dest = fs.get_fs(dest_url)
        filesystem.put_file(local_tmp, dest)
        os.unlink(local_tmp)


def tmp_dir_for(output: str) -> str:
    """Where a task writes its shards before committing them: ``OUTPUT/_tmp/`` for a local output
    (cleaned at each run's start), else this process's :func:`staging_dir`."""
    if fs.is_local(output):
        _, path = fs.get_fs(output)
        d = layout.tmp_dir(path)
        os.makedirs(d, exist_ok=True)
        return d
    return staging_dir()


_staging: str | None = None


def staging_dir() -> str:
    """This process's directory for shards bound for an object store, under the system temp dir:
    one per process, so that the files of one killed mid-task (never uploaded, up to a shard each)
    are removed by the next process that stages here, once their process no longer runs."""
    global _staging
    if _staging is None or not _staging.endswith(f"-{os.getpid()}"):  # (a forked worker makes its own)
        uid = getattr(os, "getuid", lambda: None)()
        # per user and host (containers sharing a temp dir do not share process ids), private to the user
        root = os.path.join(tempfile.gettempdir(), f"mlm-pipeline-staging-{uid}-{socket.gethostname()}")
        os.makedirs(root, mode=0o700, exist_ok=True)
        info = os.lstat(root)
        if uid is not None and (info.st_uid != uid or stat.S_IMODE(info.st_mode) & 0o077 or not stat.S_ISDIR(info.st_mode)):
            _staging = tempfile.mkdtemp(prefix="mlm-pipeline-staging-", suffix=f"-{os.getpid()}")  # not ours: no sharing
            return _staging
        for name in os.listdir(root):
            pid = name.rsplit("-", 1)[-1]
            if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        _staging = os.path.join(root, f"process-{os.getpid()}")
        os.makedirs(_staging, exist_ok=True)
    return _staging


def _running(pid: int) -> bool:
    if os.name == "nt":  # (os.kill there would stop the process): never removed
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def abort_stale_uploads(output: str, older_than: float = 0.0) -> int:
    """Abort the multipart uploads under an ``s3://`` output's shard directories that were started
    more than ``older_than`` seconds ago: a process killed while uploading a shard of 100 MiB or
    more (s3fs uploads those in parts) leaves its parts stored, invisible and billed, until they
    are aborted. Returns how many were aborted; 0 for any other storage."""
    if not output.startswith(("s3://", "s3a://")):
        return 0
    filesystem = fs.get_fs(output)[0]
    now = datetime.datetime.now(datetime.timezone.utc)
    aborted = 0
    try:  # (needs s3:ListBucketMultipartUploads and s3:AbortMultipartUpload: a cleanup, never fatal)
        for directory in layout.shard_dir_urls(output):
            bucket, _, key = fs.get_fs(directory)[1].partition("/")
            prefix = key.rstrip("/") + "/"
            uploads = filesystem.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix).get("Uploads", [])
            for upload in uploads:
                if (now - upload["Initiated"]).total_seconds() >= older_than:
                    filesystem.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload["Key"],
                                       UploadId=upload["UploadId"])
                    aborted += 1
    except Exception as exc:  # noqa: BLE001
        log.warning("could not abort the incomplete uploads under %s (%s: %s)", output, type(exc).__name__, exc)
    if aborted:
        log.info("aborted %d incomplete upload(s) of killed processes under %s", aborted, output)
    return aborted


def clean_tmp(output: str) -> None:
    """Remove leftovers of killed runs (never visible as shards or markers, but they take space):
    shards being written, and markers and run files being written."""
    abort_stale_uploads(output)
    if fs.is_local(output):
        _, path = fs.get_fs(output)
        shutil.rmtree(layout.tmp_dir(path), ignore_errors=True)
        for directory in (output, layout.tasks_url(output), *layout.shard_dir_urls(output)):
            fs.remove_write_leftovers(directory)


def tidy_tmp(output: str, older_than: float) -> None:
    """Once its run is complete, remove what killed workers left: the uploads of an ``s3://``
    output (:func:`abort_stale_uploads`), and from a local output's ``_tmp/`` the files no live
    writer holds, then ``_tmp/`` if empty. Workers sharing a run (array, claim) keep it while others
    may write there, and the one that writes the manifest tidies it: a file or upload not written
    for ``older_than`` seconds (the run's stall or lease time, the longer) is a killed worker's (a
    live writer writes each block, or its stall alarm ends it). A straggler still running a task
    taken over keeps its open file, and makes ``_tmp/`` again to open the next (:func:`open_in_tmp`)."""
    abort_stale_uploads(output, older_than)
    if not fs.is_local(output):
        return
    tmp = layout.tmp_dir(fs.get_fs(output)[1])
    now = time.time()
    try:  # the directory itself, never what a link in its place points to
        fd = fs.open_local_dir(tmp)
    except OSError:  # absent, or a link (left alone)
        return
    try:
        for entry in list(os.scandir(fd)):
            try:
                if entry.is_file(follow_symlinks=False) and \
                        now - entry.stat(follow_symlinks=False).st_mtime >= older_than:
                    os.remove(entry.name, dir_fd=fd)
            except OSError:  # (gone meanwhile)
                pass
    finally:
        os.close(fd)
    try:
        os.rmdir(tmp)
    except OSError:  # not empty (a straggler writes there), or not a directory
        pass


class ShardSink:
    """Writes a task's instances into ``part-TASK-00000``, ``-00001``... of bounded size.

    ``fmt`` is a format name of the registry (the run's ``format`` setting) or an
    :class:`OutputFormat`; :meth:`close` returns the manifest entries of the committed shards.
    """

    def __init__(
        self,
        output: str,
        task_id: str,
        *,
        fmt: str | OutputFormat,
        max_instances_per_shard: int,
        max_seq_length: int,
        max_predictions: int,
        vocab_size: int | None = None,
        writer_options: dict | None = None,
        masking: str | None = None,
    ):
        self.output = output
        self.task_id = task_id
        self.format = fmt if isinstance(fmt, OutputFormat) else get_output_format(fmt)
        self.limit = max_instances_per_shard
        self.writer_args = {"max_seq_length": max_seq_length, "max_predictions": max_predictions,
                            "vocab_size": vocab_size, "masking": masking, **(writer_options or {})}
        self.tmp_dir = tmp_dir_for(output)
        self.shards: list[dict] = []
        self._writer = None
        self._file: HashingFile | None = None
        self._tmp_path = None
        self._count = 0
        self._rows = 0  # the task's instances in its committed shards (a writer may number rows)

    def _open(self) -> None:
        self._tmp_path = os.path.join(self.tmp_dir, layout.tmp_shard_name(self.task_id))
        self._file = HashingFile(self._tmp_path)
        self._writer = self.format.open_writer(self._file, task_id=self.task_id, first_row=self._rows,
                                               **self.writer_args)
        self._count = 0

    def _close_file(self) -> dict[str, bytes]:
        try:
            companions = self._writer.close() or {}
        finally:
            self._file.close()
        return companions

    def _commit(self) -> None:
        companions = self._close_file()
        name = layout.shard_name(self.task_id, len(self.shards), self.format.extension[1:])
        size = os.path.getsize(self._tmp_path)
        if size != self._file.tell():
            raise OSError(f"{self._tmp_path}: {size} bytes on disk, {self._file.tell()} written")
        digest = self._file.hexdigest()
        entry = {"path": layout.shard_path(name), "instances": self._count, "bytes": size, "sha256": digest}
        if companions:  # committed first: a shard that exists has them
            entry["companions"] = [self._commit_companion(layout.companion_name(name, extension), companions[extension])
                                   for extension in self.format.companions]
        commit_file(self._tmp_path, fs.join(layout.shards_url(self.output), name))
        entry.update(getattr(self._writer, "shard_entry", None) or {})  # (a format's own, such as MDS's columns)
        self.shards.append(entry)
        self._rows += self._count
        self._writer = None
        self._file = None
        self._tmp_path = None

    def _commit_companion(self, name: str, data: bytes) -> dict:
        """Commit a companion file of the shard being committed; its manifest entry."""
        tmp = os.path.join(self.tmp_dir, layout.tmp_shard_name(self.task_id))
        f = HashingFile(tmp)
        try:
            f.write(data)
        finally:
            f.close()
        commit_file(tmp, fs.join(layout.shards_url(self.output), name))
        return {"path": layout.shard_path(name), "bytes": len(data), "sha256": f.hexdigest()}

    def write(self, batch: InstanceBatch) -> None:
        start = 0
        while start < len(batch):
            if self._writer is None:
                self._open()
            room = self.limit - self._count
            stop = min(len(batch), start + room)
            full = self._count + stop - start >= self.limit
            if hasattr(self._writer, "room"):  # a format whose shards are also cut by bytes (MDS)
                fits = self._writer.room(batch.slice(start, stop))
                full = full or fits < stop - start
                stop = start + fits
            self._writer.write(batch.slice(start, stop))
            self._count += stop - start
            start = stop
            if full:
                self._commit()

    def close(self) -> list[dict]:
        if self._writer is not None and self._count > 0:
            self._commit()
        elif self._writer is not None:
            self._close_file()
            os.unlink(self._tmp_path)
        self._remove_stale()
        return self.shards

    def _remove_stale(self) -> None:
        """Delete this task's shards numbered past the ones it committed. Shards are committed as
        they fill, in order, so an earlier attempt of the task that was stopped (or that read
        other input, or ran with other settings in a replaced run) may have left more of them,
        which a glob over ``shards/`` would read; a rerun rewrites the others with the same
        bytes. One existence check when there are none."""
        k = len(self.shards)
        while True:
            name = layout.shard_name(self.task_id, k, self.format.extension[1:])
            url = fs.join(layout.shards_url(self.output), name)
            if not fs.exists(url):
                return
            fs.remove(url)
            for extension in self.format.companions:  # (after the shard: a shard never lacks them)
                companion = fs.join(layout.shards_url(self.output), layout.companion_name(name, extension))
                if fs.exists(companion):
                    fs.remove(companion)
            k += 1

    def abort(self) -> None:
        if self._writer is not None:
            try:
                self._close_file()
            finally:
                if self._tmp_path and os.path.exists(self._tmp_path):
                    os.unlink(self._tmp_path)


class OutFilesSink:
    """Writes a task's instances round-robin into its share of ELECTRA's ``N`` output files.

    ``pretrain_data.tfrecord-{i}-of-{N}`` under ``OUTPUT/pretrain_tfrecords/``. As in ELECTRA's
    multi-process run, task ``j`` of ``T`` owns the files ``i`` with ``i % T == j`` and deals
    its instances to them in turn; with one task (a reference run), instance ``n`` goes to file
    ``n % N``, as ELECTRA writes them. Every owned file is committed, empty ones too (ELECTRA
    creates all ``N``). Files are appended to per block (opened, written, closed), so ``N``
    files never need ``N`` open handles; their SHA-256 is computed as the bytes go through.
    """

    def __init__(
        self,
        output: str,
        task_id: str,
        *,
        fmt: str | OutputFormat,
        task_index: int,
        task_count: int,
        num_out_files: int,
        max_seq_length: int,
        max_predictions: int,
        vocab_size: int | None = None,
        masking: str | None = None,
    ):
        if num_out_files < task_count:
            raise ConfigError(
                f"--num-out-files {num_out_files} is fewer than the run's {task_count} tasks (each task writes "
                f"its own files): give at least {task_count}, or a larger --split-size"
            )
        self.output = output
        self.task_id = task_id
        self.format = fmt if isinstance(fmt, OutputFormat) else get_output_format(fmt)
        self.writer_args = {"max_seq_length": max_seq_length, "max_predictions": max_predictions,
                            "vocab_size": vocab_size, "masking": masking}
        self.indices = list(range(task_index, num_out_files, task_count))
        self.names = [layout.out_file_name(i, num_out_files) for i in self.indices]
        tmp = tmp_dir_for(output)
        self.tmp_paths = [os.path.join(tmp, layout.tmp_shard_name(task_id)) for _ in self.indices]
        self.hashes = [hashlib.sha256() for _ in self.indices]
        self.counts = [0] * len(self.indices)
        self.sizes = [0] * len(self.indices)
        self.next = 0  # the file the next instance goes to (an index into ``self.indices``)
        for path in self.tmp_paths:
            open_in_tmp(path, "wb").close()

    def write(self, batch: InstanceBatch) -> None:
        m = len(self.indices)
        rows = (self.next + np.arange(len(batch))) % m
        # the files this batch reaches: all of them, or the len(batch) in turn from ``next``
        for k in range(m) if len(batch) >= m else rows.tolist():
            taken = np.flatnonzero(rows == k)
            buffer = io.BytesIO()
            writer = self.format.open_writer(buffer, **self.writer_args)
            writer.write(batch.take(taken))
            writer.close()
            data = buffer.getbuffer()
            with open(self.tmp_paths[k], "ab") as f:
                f.write(data)
            self.hashes[k].update(data)
            self.sizes[k] += len(data)
            self.counts[k] += len(taken)
        self.next = (self.next + len(batch)) % m

    def close(self) -> list[dict]:
        shards = []
        for name, path, digest, count, size in zip(self.names, self.tmp_paths, self.hashes, self.counts, self.sizes):
            if os.path.getsize(path) != size:
                raise OSError(f"{path}: {os.path.getsize(path)} bytes on disk, {size} written")
            commit_file(path, fs.join(layout.out_files_url(self.output), name))
            shards.append({"path": layout.out_file_path(name), "instances": count, "bytes": size,
                           "sha256": digest.hexdigest()})
        return shards

    def abort(self) -> None:
        for path in self.tmp_paths:
            if os.path.exists(path):
                os.unlink(path)


def open_sink(config, task_id: str, *, task_index: int, task_count: int, max_predictions: int,
              vocab_size: int | None = None):
    """The sink a run's settings ask for: ELECTRA's output files with ``num_out_files``, else shards.
    ``vocab_size``: the tokenizer's, for formats whose id type follows it; the writers are also
    told the run's ``masking``, for formats whose columns follow it."""
    if config.num_out_files is not None:
        return OutFilesSink(
            config.output, task_id, fmt=config.format, task_index=task_index, task_count=task_count,
            num_out_files=config.num_out_files, max_seq_length=config.max_seq_length,
            max_predictions=max_predictions, vocab_size=vocab_size, masking=config.masking,
        )
    return ShardSink(
        config.output, task_id, fmt=config.format, max_instances_per_shard=config.max_instances_per_shard,
        max_seq_length=config.max_seq_length, max_predictions=max_predictions, vocab_size=vocab_size,
        writer_options={"mds_compression": config.mds_compression, "objective": config.objective},
        masking=config.masking,
    )
