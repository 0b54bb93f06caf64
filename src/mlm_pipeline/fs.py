"""The one filesystem layer: local paths, ``s3://``, ``gs://``... all through fsspec.

Credentials come from each backend's standard chain (environment, config files, instance
metadata); an S3-compatible endpoint is taken from ``AWS_ENDPOINT_URL`` (which the CLI's
``--s3-endpoint-url`` sets). Nothing here logs or stores credentials.
"""

from __future__ import annotations

import glob as _glob
import os
import uuid

import fsspec
from fsspec.core import url_to_fs

from mlm_pipeline.read.base import InputError


def get_fs(url: str):
    """(filesystem, path) for a URL or local path."""
    try:
        return url_to_fs(url)
    except ImportError as exc:
        raise InputError(
            f"{url}: no filesystem for this scheme ({exc}); install the matching extra, "
            "e.g. pip install 'mlm-pipeline[s3]'"
        ) from exc


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def join(base: str, *parts: str) -> str:
    base = base.rstrip("/")
    return "/".join([base, *[p.strip("/") for p in parts]])


def open_url(url: str, mode: str = "rb"):
    fs, path = get_fs(url)
    return fs.open(path, mode)


def _protocol_prefix(url: str) -> str:
    return url.split("://", 1)[0] + "://" if "://" in url else ""


def expand_inputs(inputs: list[str]) -> list[str]:
    """Files named by paths, directories (recursive) and globs, sorted, hidden files skipped.

    Raises ``InputError`` naming every input that matches nothing, before any work starts.
    """
    found: list[str] = []
    missing: list[str] = []
    for item in inputs:
        fs, path = get_fs(item)
        prefix = _protocol_prefix(item)
        if _glob.has_magic(path):
            matches = [m for m in fs.glob(path) if fs.isfile(m)]
        elif fs.isdir(path):
            matches = [m for m in fs.find(path) if not os.path.basename(m).startswith(".")]
        elif fs.exists(path):
            matches = [path]
        else:
            matches = []
        if not matches:
            missing.append(item)
            continue
        for m in sorted(matches):
            found.append(prefix + m if prefix and not m.startswith(prefix) else m)
    if missing:
        raise InputError("no input found at: " + ", ".join(missing))
    # keep order stable and unique
    seen: set[str] = set()
    out = []
    for f in found:
        if f not in seen:
            seen.add(f)
            out.append(f)
    return out


def file_size(url: str) -> int:
    fs, path = get_fs(url)
    return int(fs.size(path))


def atomic_write_bytes(url: str, data: bytes) -> None:
    """Make ``data`` appear at ``url`` all at once or not at all.

    Local: write a temporary file beside the target, fsync, then ``os.replace``. Object stores:
    one PUT (or a completed multipart upload), which is atomic by the store's semantics; no ACL is
    set, so objects stay private.
    """
    fs, path = get_fs(url)
    if is_local(url):
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    else:
        fs.pipe_file(path, data)


def read_bytes(url: str) -> bytes:
    fs, path = get_fs(url)
    return fs.cat_file(path)


def exists(url: str) -> bool:
    fs, path = get_fs(url)
    fs.invalidate_cache(path)
    return fs.exists(path)


def listdir(url: str) -> list[str]:
    """Entries of a directory or prefix, listed afresh (never from a cached listing: other
    processes and machines may have added objects since)."""
    fs, path = get_fs(url)
    fs.invalidate_cache(path)
    if not fs.exists(path):
        return []
    prefix = _protocol_prefix(url)
    return [prefix + p if prefix and not p.startswith(prefix) else p for p in fs.ls(path, detail=False)]


__all__ = [
    "atomic_write_bytes",
    "exists",
    "expand_inputs",
    "file_size",
    "fsspec",
    "get_fs",
    "is_local",
    "join",
    "listdir",
    "open_url",
    "read_bytes",
]
