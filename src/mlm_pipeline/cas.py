"""Conditional writes on small objects: create-if-absent and compare-and-swap, per storage backend.

The claim mode's leases (:mod:`mlm_pipeline.executors.leases`) and the write-once manifest need two
primitives that plain fsspec does not offer portably:

``create(url, data) -> version | None``
    Make the object exist with ``data`` unless it already exists (``None`` then).
``replace(url, data, version) -> version | None``
    Overwrite the object only if it is still at ``version`` (``None`` if it changed or is gone).

plus ``read(url) -> (data, version) | None`` and ``delete(url)``. A *version* is an opaque token
naming one write of the object: the ETag on S3, the generation on GCS, a content digest locally.

How each backend provides them:

* **S3** (and S3-compatible stores): ``PutObject`` with ``If-None-Match: *`` (create) and
  ``If-Match: ETAG`` (replace), through s3fs's client so the endpoint and credentials are the same
  as for every other access. A refused condition comes back as HTTP 412 ``PreconditionFailed`` —
  which s3fs turns into ``FileExistsError`` when the server names the condition (moto) and into
  ``OSError(EINVAL)`` otherwise (SeaweedFS) — or as 409 ``ConditionalRequestConflict`` when two
  conditional writes race on AWS; all three mean "lost". Tested against SeaweedFS and moto, which
  both honour both headers. ETags of two writes differ because every lease body holds a fresh
  nonce.
* **GCS**: ``ifGenerationMatch=0`` (create) and ``ifGenerationMatch=GEN`` (replace) on one
  multipart upload through gcsfs's authenticated session; 412 means lost. (Multipart, not a
  media upload: fake-gcs-server, which the tests use, checks preconditions only on the former.)
* **Local or shared (POSIX) directories**: create writes a temporary file and hard-links it to
  the name (``link`` fails if the name exists, like ``O_CREAT | O_EXCL``, and the object is whole
  when it appears; ``O_EXCL`` under the lock where hard links are unsupported). Replace holds an
  exclusive ``fcntl.flock`` on ``NAME.lock`` so compare-then-write cannot interleave, and writes
  by rename, so a reader never sees a partial object. (``flock`` on NFS needs NFSv4 or a lock
  daemon; object stores are the better place for many machines.)

Other fsspec backends (``memory://`` for tests, HDFS...) get a process-local fallback that is
correct only within one process.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import threading
import uuid
from typing import Iterator, NamedTuple

from mlm_pipeline import fs


class Versioned(NamedTuple):
    data: bytes
    version: str


class ConditionalStore:
    """Interface; see the module docstring. ``url`` is a full URL or local path."""

    def create(self, url: str, data: bytes) -> str | None:
        """Write ``data`` if nothing is at ``url``: its version, or None if something was.

        A client may retry a write whose answer was lost; the retry then fails its condition
        against that very write, and None comes back for a write that succeeded. A caller whose
        contents are its own alone (a lease holds a fresh nonce) can tell with :func:`ours`."""
        raise NotImplementedError

    def read(self, url: str) -> Versioned | None:
        raise NotImplementedError

    def replace(self, url: str, data: bytes, version: str) -> str | None:
        raise NotImplementedError

    def delete(self, url: str) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# S3


def _s3_errors(exc: BaseException) -> Iterator[tuple[str, int | None]]:
    """(error code, HTTP status) of the botocore responses in ``exc`` and what it wraps."""
    for e in (exc, exc.__cause__, exc.__context__):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            yield str(response.get("Error", {}).get("Code", "")), response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def _s3_lost(exc: BaseException) -> bool:
    """Whether an s3fs/botocore error means "the condition did not hold" (another writer won)."""
    if isinstance(exc, FileExistsError):
        return True
    return any(code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409") or status in (409, 412)
               for code, status in _s3_errors(exc))


def _s3_missing(exc: BaseException) -> bool:
    if isinstance(exc, FileNotFoundError):
        return True
    return any(code in ("NoSuchKey", "404", "NotFound") for code, _ in _s3_errors(exc))


class S3Store(ConditionalStore):
    def _split(self, url: str):
        filesystem, path = fs.get_fs(url)
        bucket, _, key = path.partition("/")
        return filesystem, bucket, key

    def _put(self, url: str, data: bytes, **condition) -> str | None:
        filesystem, bucket, key = self._split(url)
        try:
            out = filesystem.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)
        except Exception as exc:  # noqa: BLE001 - classified below
            if _s3_lost(exc) or ("IfMatch" in condition and _s3_missing(exc)):
                return None
            raise
        finally:
            filesystem.invalidate_cache(f"{bucket}/{key}")
        return out["ETag"]

    def create(self, url: str, data: bytes) -> str | None:
        return self._put(url, data, IfNoneMatch="*")

    def replace(self, url: str, data: bytes, version: str) -> str | None:
        return self._put(url, data, IfMatch=version)

    def read(self, url: str) -> Versioned | None:
        from fsspec.asyn import sync

        filesystem, bucket, key = self._split(url)

        async def _get() -> Versioned:
            out = await filesystem._call_s3("get_object", Bucket=bucket, Key=key)
            async with out["Body"] as stream:
                return Versioned(await stream.read(), out["ETag"])

        try:
            return sync(filesystem.loop, _get)
        except Exception as exc:  # noqa: BLE001
            if _s3_missing(exc):
                return None
            raise

    def delete(self, url: str) -> None:
        filesystem, bucket, key = self._split(url)
        try:
            filesystem.call_s3("delete_object", Bucket=bucket, Key=key)
        except Exception as exc:  # noqa: BLE001
            if not _s3_missing(exc):
                raise
        finally:
            filesystem.invalidate_cache(f"{bucket}/{key}")


# --------------------------------------------------------------------------------------------
# GCS


class GCSStore(ConditionalStore):
    def _split(self, url: str):
        filesystem, path = fs.get_fs(url)
        bucket, _, key = path.partition("/")
        return filesystem, bucket, key

    def _upload(self, url: str, data: bytes, generation: str) -> str | None:
        """One multipart upload (metadata + content) with ``ifGenerationMatch``."""
        from fsspec.asyn import sync

        filesystem, bucket, key = self._split(url)
        location = f"{filesystem._location}/upload/storage/v1/b/{bucket}/o"
        boundary = uuid.uuid4().hex
        body = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
                f"{json.dumps({'name': key})}\r\n--{boundary}\r\n"
                "Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--".encode()
        try:
            out = sync(filesystem.loop, filesystem._call, "POST", location, uploadType="multipart",
                       ifGenerationMatch=generation, data=body, json_out=True,
                       headers={"Content-Type": f'multipart/related; boundary="{boundary}"'})
        except (FileExistsError, FileNotFoundError):  # gcsfs's translations of HTTP 412 / 404
            return None
        finally:
            filesystem.invalidate_cache(f"{bucket}/{key}")
        return str(out["generation"])

    def create(self, url: str, data: bytes) -> str | None:
        return self._upload(url, data, "0")

    def replace(self, url: str, data: bytes, version: str) -> str | None:
        return self._upload(url, data, version)

    def read(self, url: str) -> Versioned | None:
        from fsspec.asyn import sync

        filesystem, bucket, key = self._split(url)
        try:  # one GET: the content and, in a response header, the generation it belongs to
            headers, data = sync(filesystem.loop, filesystem._call, "GET", filesystem.url(f"{bucket}/{key}"))
        except FileNotFoundError:
            return None
        generation = {k.lower(): v for k, v in headers.items()}.get("x-goog-generation")
        if generation is None:
            raise OSError(f"{url}: the store returned no object generation")
        return Versioned(data, str(generation))

    def delete(self, url: str) -> None:
        filesystem, bucket, key = self._split(url)
        try:
            filesystem.rm_file(f"{bucket}/{key}")
        except FileNotFoundError:
            pass
        filesystem.invalidate_cache(f"{bucket}/{key}")


# --------------------------------------------------------------------------------------------
# Local / POSIX shared directories


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LocalStore(ConditionalStore):
    @staticmethod
    def _path(url: str) -> str:
        return fs.get_fs(url)[1]

    @contextlib.contextmanager
    def _locked(self, path: str):
        import fcntl

        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    @staticmethod
    def _write_replace(path: str, data: bytes) -> None:
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def create(self, url: str, data: bytes) -> str | None:
        path = self._path(url)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic create-if-absent, and the content is whole when it appears
        except FileExistsError:
            return None
        except OSError as exc:  # a filesystem without hard links: O_EXCL under the lock
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            with self._locked(path):
                try:
                    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    return None
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
        finally:
            os.unlink(tmp)
        return _digest(data)

    def read(self, url: str) -> Versioned | None:
        try:  # objects only ever appear or change by link/rename: a read sees a whole version
            with open(self._path(url), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        return Versioned(data, _digest(data))

    def replace(self, url: str, data: bytes, version: str) -> str | None:
        path = self._path(url)
        with self._locked(path):
            try:
                with open(path, "rb") as f:
                    current = f.read()
            except FileNotFoundError:
                return None
            if _digest(current) != version:
                return None
            self._write_replace(path, data)
        return _digest(data)

    def delete(self, url: str) -> None:
        # unconditional, so no lock: a concurrent replace either sees the file gone or re-creates it
        # whole, which is what an S3 PUT racing a DELETE does too
        path = self._path(url)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        # and the lock file of replace(): a deleted object (a released lease) leaves none behind; a
        # replace racing this finds the object gone either way
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + ".lock")


# --------------------------------------------------------------------------------------------
# Anything else (memory:// in tests): correct within one process only


class ProcessLocalStore(ConditionalStore):
    _lock = threading.Lock()

    def create(self, url: str, data: bytes) -> str | None:
        with self._lock:
            if fs.exists(url):
                return None
            fs.atomic_write_bytes(url, data)
        return _digest(data)

    def read(self, url: str) -> Versioned | None:
        with self._lock:
            try:
                data = fs.read_bytes(url)
            except FileNotFoundError:
                return None
        return Versioned(data, _digest(data))

    def replace(self, url: str, data: bytes, version: str) -> str | None:
        with self._lock:
            try:
                current = fs.read_bytes(url)
            except FileNotFoundError:
                return None
            if _digest(current) != version:
                return None
            fs.atomic_write_bytes(url, data)
        return _digest(data)

    def delete(self, url: str) -> None:
        filesystem, path = fs.get_fs(url)
        with self._lock, contextlib.suppress(FileNotFoundError):
            filesystem.rm_file(path)


def store_for(url: str) -> ConditionalStore:
    """The conditional-write implementation for ``url``'s storage."""
    if fs.is_local(url):
        return LocalStore()
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("s3", "s3a"):
        return S3Store()
    if scheme in ("gs", "gcs"):
        return GCSStore()
    return ProcessLocalStore()


def ours(store: ConditionalStore, url: str, data: bytes) -> str | None:
    """After a conditional write of ``data`` failed: the object's version if it holds ``data``
    (our own write, whose answer was lost and whose retry failed against it), else None. Only for
    contents no other writer could write."""
    now = store.read(url)
    return now.version if now is not None and now.data == data else None


def create_bytes(url: str, data: bytes) -> bool:
    """Write ``data`` at ``url`` unless an object is already there; whether this call wrote it."""
    return store_for(url).create(url, data) is not None


__all__ = ["ConditionalStore", "Versioned", "create_bytes", "store_for"]
