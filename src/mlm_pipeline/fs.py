"""The one filesystem layer: local paths, ``s3://``, ``gs://``... all through fsspec.

Credentials come from each backend's standard chain (environment, config files, instance
metadata); an S3-compatible endpoint is taken from ``AWS_ENDPOINT_URL`` (which the CLI's
``--s3-endpoint-url`` sets). Nothing here logs or stores credentials.

fsspec is imported when first used: what a local run asks of this module (open, list, read a
small file, ...) goes to ``os`` in the local branches here, so a local ``prepare`` does not load
fsspec and the asyncio it imports.
:func:`get_fs` still gives every caller a filesystem for a local path too: fsspec's, imported on
its first use.

Why one module: it is the one place that knows how storage is reached; each operation keeps its
local branch beside the object-store one, so that both change together.
"""

from __future__ import annotations

import glob as _glob
import hashlib
import os
import stat
import uuid
from typing import Iterable, Iterator

from mlm_pipeline.errors import InputError, redact_credentials, url_credentials_message


_STORAGE_LIBRARIES = ("botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "google", "urllib3", "requests")


def storage_error(exc: BaseException) -> str | None:
    """One line for an error of a storage client (endpoint unreachable, access denied, no such
    bucket), naming the endpoint; None for any other error. botocore's errors are not ``OSError``s,
    so without this they reach the user as a traceback of hundreds of lines."""
    chain = []
    while exc is not None and len(chain) < 8:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    for err in chain:
        module = type(err).__module__.split(".", 1)[0]
        if module in _STORAGE_LIBRARIES:
            endpoint = redact_credentials(os.environ.get("AWS_ENDPOINT_URL") or "the default endpoint")
            detail = redact_credentials(" ".join(str(err).split()))
            return (f"storage error ({endpoint}): {type(err).__name__}: {detail} (the storage client retried "
                    "before giving up; check the endpoint, network and credentials)")
    return None


def get_fs(url: str):
    """(filesystem, path) for a URL or local path; a URL holding credentials is refused."""
    refused = url_credentials_message(url)
    if refused is not None:
        raise InputError(refused)
    path = _local_path(url)
    if path is not None:
        return _LOCAL, path
    from fsspec.core import url_to_fs

    try:
        return url_to_fs(url)
    except ImportError as exc:
        raise InputError(
            f"{url}: no filesystem for this scheme ({exc}); install the matching extra, "
            "e.g. pip install 'mlm-pipeline[s3]'"
        ) from exc


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _local_path(url: str) -> str | None:
    """The path fsspec gives a local ``url`` (absolute, ``file:`` stripped, no trailing ``/``),
    found without importing fsspec (as its ``LocalFileSystem._strip_protocol``); None where fsspec
    is asked (a chained ``a::b`` or ``data:`` URL, a remote one, Windows paths)."""
    if os.sep != "/" or not is_local(url) or "::" in url or url.startswith("data:"):
        return None
    for prefix in ("file://", "file:", "local:"):
        if url.startswith(prefix):
            url = url[len(prefix):]
            break
    if url.startswith("~"):
        url = os.path.expanduser(url)
    elif not url.startswith("/"):
        url = f"{os.getcwd()}/{'' if url == '.' else url.removeprefix('./')}"
    return url.rstrip("/") if len(url) > 1 else url


class _LocalFileSystem:
    """fsspec's local filesystem, imported on its first use: the local branches of this module go
    to ``os``, and a caller that asks the filesystem of a local path for its path only needs
    none."""

    def __getattr__(self, name: str):
        from fsspec.implementations.local import LocalFileSystem

        return getattr(LocalFileSystem(), name)  # (fsspec keeps one instance: url_to_fs's)


_LOCAL = _LocalFileSystem()


def join(base: str, *parts: str) -> str:
    base = base.rstrip("/")
    return "/".join([base, *[p.strip("/") for p in parts]])


def open_url(url: str, mode: str = "rb"):
    fs, path = get_fs(url)
    if fs is _LOCAL and "b" in mode:  # (fsspec's local files wrap this very file)
        return open(path, mode)
    return fs.open(path, mode)


RANGE_BLOCK_BYTES = 4 << 20


def open_ranges(url: str, block_size: int = RANGE_BLOCK_BYTES):
    """``url`` opened to read ranges of it here and there (the loader's row reads).

    Local files unbuffered: a buffered file reads at least a block (4 KiB or more) wherever it is
    asked for a few bytes, as a Parquet reader is for a footer or a small column chunk, and the
    readers buffer what they stream themselves. On an object store, fetched in blocks of
    ``block_size``: fsspec's buffered files read ahead a whole block on every miss (s3fs: 50 MiB),
    so a reader that reads part of a shard, as each loader worker does in an interleaved epoch,
    would fetch the rest of it. ``block_size=0``: no read-ahead, one request per read (for a few
    small ranges far apart, such as a Parquet footer and small column chunks).
    """
    fs, path = get_fs(url)
    if is_local(url):
        return open(path, "rb", buffering=0)
    if not block_size:
        return fs.open(path, "rb", cache_type="none")
    return fs.open(path, "rb", block_size=block_size)


def open_head(url: str, nbytes: int, *, size: int | None = None):
    """``url`` opened to read about its first ``nbytes`` (a format sniff): one request of
    ``nbytes`` on an object store.

    fsspec's buffered files read ahead a whole block on every miss (s3fs: 50 MiB), so a 64 KiB
    head read through ``open_url`` fetches 50 MiB; planning reads a head of every input, and a
    corpus of 100,000 files would fetch terabytes. A known ``size`` (from the listing) also spares
    the request for the object's metadata.
    """
    if is_local(url):
        return open_url(url)
    fs, path = get_fs(url)
    options: dict = {"block_size": max(1, nbytes), "cache_type": "first"}
    if size is not None:
        options["size"] = size
    return fs.open(path, "rb", **options)


def _protocol_prefix(url: str) -> str:
    return url.split("://", 1)[0] + "://" if "://" in url else ""


def expand_inputs(inputs: list[str]) -> list[str]:
    """Files named by paths, directories (recursive) and globs, sorted, hidden files skipped.

    Raises ``InputError`` naming every input that matches nothing, before any work starts.
    """
    return [url for url, _ in list_inputs(inputs)]


def _walk_local(root: str, skipped: list[dict]) -> dict[str, dict]:
    """The files under a local directory, following links to directories once: a link to a
    directory already listed (a loop, or the same files twice) and whatever cannot be read (a
    broken link, a socket, a directory without permission) are added to ``skipped`` with their
    reason. Hidden files and directories are left out, as from a listing."""
    found: dict[str, dict] = {}
    seen: set[tuple[int, int]] = set()

    def skip(path: str, reason: str, detail: str) -> None:
        skipped.append({"path": path, "reason": reason, "detail": detail})

    def visit(directory: str) -> None:
        st = os.stat(directory)
        if (st.st_dev, st.st_ino) in seen:
            skip(directory, "directory_link_seen", "a link to a directory already listed (a loop, or the same "
                 "files twice): not listed again")
            return
        seen.add((st.st_dev, st.st_ino))
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            skip(directory, "unreadable", f"cannot list it: {exc.strerror or exc}")
            return
        for entry in entries:
            try:
                if entry.name.startswith("."):  # hidden files and directories (.git/, .cache/, ...)
                    continue
                if entry.is_dir(follow_symlinks=True):
                    visit(entry.path)
                elif entry.is_file(follow_symlinks=True):
                    found[entry.path] = {"type": "file", "size": entry.stat(follow_symlinks=True).st_size}
                elif entry.is_symlink() and not os.path.exists(entry.path):
                    skip(entry.path, "unreadable", f"a broken link (to {os.readlink(entry.path)})")
                else:
                    skip(entry.path, "unreadable", "not a regular file")
            except OSError as exc:
                skip(entry.path, "unreadable", exc.strerror or str(exc))

    visit(root)
    return found


def _hidden_below(root: str, path: str) -> bool:
    """``path`` is hidden, or lies in a hidden directory, below ``root`` (object-store keys)."""
    return any(part.startswith(".") for part in path[len(root.rstrip("/")):].split("/"))


def inside(directory: str, roots: Iterable[str] = ()):
    """A test of whether a URL lies inside ``directory``. A local one is matched as given, resolved,
    and as seen through each of ``roots`` (the input directories as named, links included: with
    ``link -> data``, ``-o data/out`` is ``link/out`` to a listing of ``link``), with no
    ``realpath`` per file."""
    if is_local(directory):
        path = get_fs(directory)[1]
        real = os.path.realpath(path)
        outers = {os.path.abspath(path), real}
        for root in roots:
            if is_local(root):
                given = os.path.abspath(get_fs(root)[1])
                resolved = os.path.realpath(given)
                if real == resolved or real.startswith(resolved.rstrip(os.sep) + os.sep):
                    outers.add(os.path.join(given, os.path.relpath(real, resolved)))
        prefixes = tuple(o.rstrip(os.sep) + os.sep for o in outers)
        return lambda url: is_local(url) and os.path.abspath(get_fs(url)[1]).startswith(prefixes)
    outer = directory.rstrip("/") + "/"
    return lambda url: url.startswith(outer)


def list_inputs(inputs: list[str], skipped: list[dict] | None = None) -> list[tuple[str, int]]:
    """``(url, size)`` of the files ``expand_inputs`` names, the sizes taken from the listings.

    A directory or glob is one listing (paged on an object store), not a request per file:
    planning 100,000 objects then asks for no object's metadata. In a local directory, links
    to directories are followed once (:func:`_walk_local`); what cannot be read there is added
    to ``skipped`` (a list of ``{"path", "reason", "detail"}``) instead of stopping the run.
    """
    skipped = [] if skipped is None else skipped
    found: list[tuple[str, int]] = []
    missing: list[str] = []
    for item in inputs:
        fs, path = _listed_path(item)
        if _glob.has_magic(path):  # a directory it matches is listed as if named
            matches = {}
            for m, info in fs.glob(path, detail=True).items():
                matches.update(_listing(fs, item, m, info, skipped))
        else:
            try:
                info = _local_info(path) if fs is _LOCAL else fs.info(path)
            except OSError:  # missing (or unreachable): named below, with every other
                info = None
            matches = {} if info is None else _listing(fs, item, path, info, skipped)
        if not matches:
            missing.append(item)
            continue
        for m in sorted(matches):
            size = matches[m].get("size")
            size = int(size) if size is not None else int(fs.size(m))
            url = _with_protocol(item, m)
            found.append((url, size))
            if not is_local(url):
                _LISTED[url] = matches[m]
    if missing:
        raise InputError("no input found at: " + ", ".join(missing))
    # keep order stable and unique: a local file reached by several paths (a link to it) is read
    # once, by the first of them in URL order (whatever order the inputs were named in)
    unique: dict[str, int] = {}
    for url, size in found:
        unique.setdefault(url, size)
    keys = {url: _file_key(url) for url in unique}
    kept: dict[tuple[int, int], str] = {}
    for url, key in keys.items():
        if key is not None:
            kept[key] = min(kept.get(key, url), url)
    out = []
    for url, size in unique.items():
        if keys[url] is not None and kept[keys[url]] != url:
            skipped.append({"path": url, "reason": "file_seen",
                            "detail": f"the same file as {kept[keys[url]]} (a link to it, or another path): read once"})
        else:
            out.append((url, size))
    return out


def listed_url(item: str) -> str:
    """The URL :func:`list_inputs` gives a file named as ``item`` (``./a/../a/x.txt`` is
    ``/abs/a/x.txt``), so that a file named as an input is known as such."""
    return _with_protocol(item, _listed_path(item)[1])


def _listed_path(item: str):
    """``item``'s filesystem and path as listed: a local one normalised (``a/../a/x.txt`` and
    ``a//x.txt`` are ``a/x.txt``, listed once)."""
    filesystem, path = get_fs(item)
    return filesystem, os.path.normpath(path) if is_local(item) else path


def _with_protocol(item: str, path: str) -> str:
    """A listed ``path`` as a URL of ``item``'s protocol (fsspec strips it)."""
    prefix = _protocol_prefix(item)
    return prefix + path if prefix and not path.startswith(prefix) else path


def _file_key(url: str) -> tuple[int, int] | None:
    """A local file's device and inode (None for an object, or a file that cannot be read)."""
    if not is_local(url):
        return None
    try:
        st = os.stat(get_fs(url)[1])
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _listing(fs, item: str, path: str, info: dict, skipped: list[dict]) -> dict[str, dict]:
    """The files of ``path`` (named by ``item`` or matched by its glob): itself, or those of the
    directory it is."""
    if is_local(item) and os.path.isdir(path):  # (a link to a directory too)
        return _walk_local(path, skipped)
    if info.get("type") == "directory":
        return {m: i for m, i in fs.find(path, detail=True).items() if not _hidden_below(path, m)}
    if is_local(item) and info.get("type") not in ("file", None):  # a FIFO, /dev/stdin, a device
        if _glob.has_magic(item):
            skipped.append({"path": path, "reason": "unreadable", "detail": "not a regular file"})
            return {}
        raise InputError(f"{item}: not a regular file (a pipe, a device or a socket): inputs are files that "
                         "workers can split and read again on a rerun; save the stream to a file first")
    return {path: info} if info.get("type") == "file" or not _glob.has_magic(item) else {}


SAMPLED_BLOCKS = 8
SAMPLED_BLOCK_BYTES = 4096

# What the last listing said of each object (its ETag or generation among it), so that
# fingerprinting the inputs of a plan costs no request per object after the listing that found
# them: planning 100,000 objects makes no HEAD. A run lists its inputs afresh when it starts.
_LISTED: dict[str, dict] = {}
_VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "crc32c")


def content_fingerprint(url: str, *, start: int = 0, end: int | None = None, full: bool = False,
                        file_size: bool = False) -> str:
    """What tells whether bytes ``[start, end)`` of a file changed, cheaply: for a local file where
    the range ends (the file's size for a range to its end, or with ``file_size``, as runs recorded
    before) and a SHA-256 of 8 blocks of 4 KB spread over the range (its first and last included);
    so a file that grows or is made whole past a bounded range leaves that range's fingerprint as
    it was. For an object its ETag (S3) or generation (GCS), which change with every write of the
    object; ``full``: a SHA-256 of every byte of the range.
    """
    filesystem, path = get_fs(url)
    if full:
        digest = hashlib.sha256()
        with filesystem.open(path, "rb") as f:
            f.seek(start)
            left = None if end is None else end - start
            while left is None or left > 0:
                chunk = f.read(8 << 20 if left is None else min(8 << 20, left))
                if not chunk:
                    break
                digest.update(chunk)
                if left is not None:
                    left -= len(chunk)
        return "sha256:" + digest.hexdigest()
    if is_local(url):
        size = os.path.getsize(path)
        stop = size if end is None else min(end, size)
        digest = hashlib.sha256(f"{size if file_size else stop}".encode())
        span = max(0, stop - start - SAMPLED_BLOCK_BYTES)
        offsets = sorted({start + span * i // (SAMPLED_BLOCKS - 1) for i in range(SAMPLED_BLOCKS)})
        with open(path, "rb") as f:
            for offset in offsets:
                f.seek(offset)
                digest.update(f.read(min(SAMPLED_BLOCK_BYTES, max(0, stop - offset))))
        return "sampled:" + digest.hexdigest()
    listed = _LISTED.get(url)
    info = listed if listed and any(listed.get(k) for k in _VERSION_KEYS) else filesystem.info(path)
    for key in _VERSION_KEYS:
        if info.get(key):
            return f"{key.lower()}:{str(info[key]).strip(chr(34))}:{info.get('size')}"
    return f"size-mtime:{info.get('size')}:{info.get('LastModified') or info.get('mtime') or info.get('updated')}"


def modified_ns(url: str) -> int | None:
    """A local file's modification time (ns); None for an object (its ETag says more)."""
    if not is_local(url):
        return None
    return os.stat(get_fs(url)[1]).st_mtime_ns


def file_size(url: str) -> int:
    fs, path = get_fs(url)
    return int(fs.size(path))


_ATOMIC_TMP = ".tmp-"  # .NAME.tmp-RANDOM: a local atomic write in progress (or killed)


def remove_write_leftovers(url: str) -> int:
    """Delete what local atomic writes killed midway left in directory ``url`` (``.NAME.tmp-…``
    here, ``NAME.tmp-…`` from :mod:`mlm_pipeline.cas`); only call it where no other process may be
    writing. Returns how many were removed."""
    if not is_local(url):
        return 0  # object stores write atomically, leaving nothing
    _, path = get_fs(url)
    removed = 0
    try:
        fd = open_local_dir(path)
    except OSError:  # absent, or a link (left alone)
        return 0
    try:
        for name in os.listdir(fd):
            if _ATOMIC_TMP in name:
                try:
                    os.unlink(name, dir_fd=fd)
                    removed += 1
                except OSError:
                    pass
    finally:
        os.close(fd)
    return removed


def open_local_dir(path: str) -> int:
    """A descriptor of the local directory ``path`` itself, refusing (``OSError``) a symbolic link
    in its place: cleanups list and delete through it, so that a link planted in an output never
    makes them delete files elsewhere."""
    return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))


def naming(exc: OSError, path: str) -> OSError:
    """``exc`` with ``path`` as its file name when it names none (a write that fills the disk
    raises ``[Errno 28] No space left on device`` naming no file); else ``exc`` itself."""
    if exc.filename is not None or exc.errno is None:
        return exc
    named = OSError(exc.errno, exc.strerror, path)  # (the errno's subclass: OSError picks it)
    named.__cause__ = exc
    return named


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
        tmp = os.path.join(directory, f".{os.path.basename(path)}{_ATOMIC_TMP}{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise naming(exc, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    else:
        fs.pipe_file(path, data)


def read_bytes(url: str) -> bytes:
    fs, path = get_fs(url)
    if fs is _LOCAL:
        with open(path, "rb") as f:
            return f.read()
    return fs.cat_file(path)


def read_many(urls: list[str], *, batch: int = 256) -> Iterator[bytes | None]:
    """The content of each of ``urls`` (small objects on one filesystem), in order; None for one
    that cannot be read.

    An object store gets them ``batch`` at a time through fsspec's ``cat``, which sends them
    concurrently on S3 and GCS (the 200,000 markers of a 10 TB run read one by one would take over
    an hour at 20 ms a request). A local disk gets a plain read each.
    """
    if not urls:
        return
    if is_local(urls[0]):
        for url in urls:
            try:  # never through a link (a marker is a file the run wrote)
                fd = os.open(url[len("file://"):] if url.startswith("file://") else url,
                             os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
                with open(fd, "rb") as f:
                    yield f.read()
            except OSError:
                yield None
        return
    filesystem, _ = get_fs(urls[0])
    for i in range(0, len(urls), batch):
        paths = [filesystem._strip_protocol(u) for u in urls[i:i + batch]]
        got = filesystem.cat(paths, on_error="return")
        for path in paths:
            data = got[path] if path in got else _cat_or_none(filesystem, path)  # (a key spelt otherwise)
            yield data if isinstance(data, bytes) else None


def _cat_or_none(filesystem, path: str) -> bytes | None:
    try:
        return filesystem.cat_file(path)
    except OSError:
        return None


def exists(url: str) -> bool:
    fs, path = get_fs(url)
    if fs is _LOCAL:
        return os.path.exists(path)
    fs.invalidate_cache(path)
    return fs.exists(path)


def isdir(url: str) -> bool:
    """True for a directory (or, on an object store, a prefix with objects under it)."""
    fs, path = get_fs(url)
    if fs is _LOCAL:
        return os.path.isdir(path)
    fs.invalidate_cache(path)
    return fs.isdir(path)


def listdir(url: str) -> list[str]:
    """Entries of a directory or prefix, listed afresh (never from a cached listing: other
    processes and machines may have added objects since)."""
    fs, path = get_fs(url)
    if fs is _LOCAL:
        return [_with_protocol(url, info["name"]) for info in _local_ls(path)]
    fs.invalidate_cache(path)
    if not fs.exists(path):
        return []
    return [_with_protocol(url, p) for p in fs.ls(path, detail=False)]


def remove(url: str) -> None:
    """Delete one file or object; a missing one is not an error."""
    fs, path = get_fs(url)
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        pass


def remove_tree(url: str) -> None:
    """Delete a directory (or an object store's prefix) and all it holds; a missing one is not an error."""
    fs, path = get_fs(url)
    fs.invalidate_cache(path)
    try:
        fs.rm(path, recursive=True)
    except FileNotFoundError:
        pass


def list_sizes(url: str) -> dict[str, int]:
    """``{name: size}`` of the files in a directory or prefix, listed afresh (one LIST request)."""
    fs, path = get_fs(url)
    if fs is _LOCAL:
        infos = _local_ls(path)
    else:
        fs.invalidate_cache(path)
        infos = fs.ls(path, detail=True) if fs.exists(path) else []
    return {info["name"].rstrip("/").rsplit("/", 1)[-1]: int(info.get("size") or 0)
            for info in infos if info.get("type") != "directory"}


def _local_info(path: str, entry: os.DirEntry | None = None) -> dict:
    """Name, size and type of a local path as fsspec's ``info`` gives them (a link's size and type
    are its target's, a directory entry's type the link's own, ``other`` when it is neither a file
    nor a directory), from ``os`` (``OSError`` when missing)."""
    if entry is None:
        st = os.stat(path)
    else:
        st = entry.stat(follow_symlinks=False)
        if entry.is_symlink():
            try:
                size = entry.stat(follow_symlinks=True).st_size
            except OSError:
                size = 0
            return {"name": path, "size": size, "type": "other"}
    kind = "directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    return {"name": path, "size": st.st_size, "type": kind}


def _local_ls(path: str) -> list[dict]:
    """:func:`_local_info` of each entry of a local directory (in the order the system lists
    them, as fsspec's ``ls``), of a file itself, or none where nothing is."""
    try:
        info = _local_info(path)
    except OSError:
        return []
    if info["type"] != "directory":
        return [info]
    infos = []
    with os.scandir(path) as entries:
        for entry in entries:
            try:
                infos.append(_local_info(entry.path, entry))
            except FileNotFoundError:  # (deleted meanwhile)
                pass
    return infos


__all__ = [
    "storage_error",
    "content_fingerprint",
    "modified_ns",
    "atomic_write_bytes",
    "exists",
    "expand_inputs",
    "file_size",
    "get_fs",
    "is_local",
    "isdir",
    "join",
    "list_inputs",
    "list_sizes",
    "listdir",
    "inside",
    "open_head",
    "open_local_dir",
    "open_url",
    "read_bytes",
    "read_many",
    "remove",
    "remove_tree",
    "remove_write_leftovers",
]
