"""Shard files: stream blocks into a temporary file, then commit it atomically.

A shard is first written to a temporary local file (inside ``OUTPUT/_tmp/`` for local outputs, so
the final ``os.replace`` stays on one filesystem; a system temp dir for object stores, then one
upload, which appears only once complete). Nothing named like a shard exists until it is whole.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
import uuid
from typing import BinaryIO

from mlm_pipeline import fs
from mlm_pipeline.instances.batch import InstanceBatch

SHARDS_DIR = "shards"
TMP_DIR = "_tmp"


class HashingFile(io.RawIOBase):
    """A local file opened for writing that computes its SHA-256 as the bytes go through, so a
    finished shard need not be read back to be hashed for the manifest."""

    def __init__(self, path: str):
        super().__init__()
        self._f = open(path, "wb")
        self._sha256 = hashlib.sha256()
        self._position = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._sha256.update(data)
        written = self._f.write(data)
        self._position += written
        return written

    def tell(self) -> int:
        return self._position

    def hexdigest(self) -> str:
        return self._sha256.hexdigest()

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()


class TFRecordShardWriter:
    """Appends blocks of records to one TFRecord file (an open binary file; not closed here)."""

    def __init__(self, f: BinaryIO, *, max_seq_length: int, max_predictions: int):
        self._f = f
        self._seq = max_seq_length
        self._pred = max_predictions

    def write(self, batch: InstanceBatch) -> None:
        from mlm_pipeline.write.tfrecord import iter_encoded_tfrecord

        for chunk in iter_encoded_tfrecord(batch, max_seq_length=self._seq, max_predictions=self._pred):
            self._f.write(chunk)

    def close(self) -> None:
        pass


def writer_class(fmt: str) -> type:
    """The shard writer of a format; pyarrow is imported only for Parquet (~0.4 s per process)."""
    if fmt == "parquet":
        from mlm_pipeline.write.parquet import ParquetShardWriter

        return ParquetShardWriter
    if fmt == "tfrecord":
        return TFRecordShardWriter
    raise ValueError(f"unknown output format {fmt!r}")


def shard_name(task_id: str, k: int, fmt: str) -> str:
    """A shard's file name; each output format's name is also its file extension."""
    return f"part-{task_id}-{k:05d}.{fmt}"


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
    if fs.is_local(output):
        _, path = fs.get_fs(output)
        d = os.path.join(path, TMP_DIR)
        os.makedirs(d, exist_ok=True)
        return d
    return tempfile.gettempdir()


def clean_tmp(output: str) -> None:
    """Remove leftovers of killed runs (never visible as shards, but they take space)."""
    if fs.is_local(output):
        _, path = fs.get_fs(output)
        shutil.rmtree(os.path.join(path, TMP_DIR), ignore_errors=True)


class ShardSink:
    """Writes a task's instances into ``part-TASK-00000``, ``-00001``... of bounded size."""

    def __init__(
        self,
        output: str,
        task_id: str,
        *,
        fmt: str,
        max_instances_per_shard: int,
        max_seq_length: int,
        max_predictions: int,
    ):
        self.output = output
        self.task_id = task_id
        self.fmt = fmt
        self.limit = max_instances_per_shard
        self.writer_args = {"max_seq_length": max_seq_length, "max_predictions": max_predictions}
        self.tmp_dir = tmp_dir_for(output)
        self.shards: list[dict] = []
        self._writer = None
        self._file: HashingFile | None = None
        self._tmp_path = None
        self._count = 0

    def _open(self) -> None:
        self._tmp_path = os.path.join(self.tmp_dir, f"{self.task_id}-{uuid.uuid4().hex}.partial")
        self._file = HashingFile(self._tmp_path)
        self._writer = writer_class(self.fmt)(self._file, **self.writer_args)
        self._count = 0

    def _close_file(self) -> None:
        try:
            self._writer.close()
        finally:
            self._file.close()

    def _commit(self) -> None:
        self._close_file()
        name = shard_name(self.task_id, len(self.shards), self.fmt)
        size = os.path.getsize(self._tmp_path)
        if size != self._file.tell():
            raise OSError(f"{self._tmp_path}: {size} bytes on disk, {self._file.tell()} written")
        digest = self._file.hexdigest()
        commit_file(self._tmp_path, fs.join(self.output, SHARDS_DIR, name))
        self.shards.append(
            {"path": f"{SHARDS_DIR}/{name}", "instances": self._count, "bytes": size, "sha256": digest}
        )
        self._writer = None
        self._file = None
        self._tmp_path = None

    def write(self, batch: InstanceBatch) -> None:
        start = 0
        while start < len(batch):
            if self._writer is None:
                self._open()
            room = self.limit - self._count
            stop = min(len(batch), start + room)
            self._writer.write(batch.slice(start, stop))
            self._count += stop - start
            start = stop
            if self._count >= self.limit:
                self._commit()

    def close(self) -> list[dict]:
        if self._writer is not None and self._count > 0:
            self._commit()
        elif self._writer is not None:
            self._close_file()
            os.unlink(self._tmp_path)
        return self.shards

    def abort(self) -> None:
        if self._writer is not None:
            try:
                self._close_file()
            finally:
                if self._tmp_path and os.path.exists(self._tmp_path):
                    os.unlink(self._tmp_path)
