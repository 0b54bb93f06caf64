"""One ``prepare`` at a time on a local output: an exclusive ``flock`` on ``OUTPUT/_prepare.lock``.

A second plain run on the same directory is refused at once, with a message naming the holder
(pid, host, start time). The kernel releases the lock when its holder exits, however it exits
(``kill -9`` too), so a killed run never locks its output for good; the holder deletes the file
when it finishes. Workers that share an output on purpose (``--claim``, ``--task-count``) take
the lock shared (leases and the task split keep them apart): a plain run, which would clean up
their files in progress as its own leftovers, is refused while any of them runs, and they are
refused while a plain run does. Outputs on object stores are not locked (two plain runs there are
told apart only by ``--claim``).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time

from mlm_pipeline import fs
from mlm_pipeline.errors import OutputError
from mlm_pipeline.run import layout

__all__ = ["RunLock", "refuse_a_file_as_output"]


class RunLock:
    """``with RunLock(output):`` holds the output's lock (a no-op for an object store);
    ``shared``: as one of the workers that share the output."""

    def __init__(self, output: str, *, shared: bool = False):
        self.output = output
        self.shared = shared
        self._fd: int | None = None
        self._path: str | None = None
        self._made: list[str] = []  # the directories this lock made, deepest first

    def __enter__(self) -> RunLock:
        if not fs.is_local(self.output):
            return self
        import fcntl

        _, directory = fs.get_fs(self.output)
        refuse_a_file_as_output(self.output)
        try:
            self._made = _missing_dirs(directory)
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot write to output {self.output}: {exc.strerror or exc}") from exc
        layout.refuse_links(self.output)
        path = layout.lock_path(directory)
        while True:
            try:  # never through a link: its target would be truncated and overwritten
                fd = os.open(path, os.O_CREAT | os.O_RDWR | getattr(os, "O_NOFOLLOW", 0), 0o644)
            except OSError as exc:
                if os.path.islink(path):
                    layout.refuse_links(self.output)  # (a link planted since the check): its message
                # an output this process cannot write to (a read-only mount, a directory without write
                # permission): nothing can be written there through it, so reading it (a complete run
                # reported as such) needs no lock, and a write fails naming its file
                if exc.errno == errno.EROFS or (exc.errno in (errno.EACCES, errno.EPERM)
                                                and not os.access(directory, os.W_OK)):
                    return self
                raise OutputError(f"cannot open {path}: {exc.strerror or exc}") from exc
            try:
                _flock(fd, fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX)
            except BlockingIOError:
                holder = _describe(os.read(fd, 4096))
                os.close(fd)
                if self.shared:
                    raise OutputError(f"{self.output} is in use by a plain prepare run ({holder}), which does not share "
                                      "its output: wait for it to finish, or stop it") from None
                raise OutputError(
                    f"{self.output} is in use by another prepare run ({holder}): wait for it to finish, "
                    "stop it, or give another --output"
                ) from None
            except OSError:  # a filesystem without flock (some network mounts)
                os.close(fd)
                if not self.shared:
                    raise
                return self  # shared workers go on unlocked, as leases and the task split keep them apart
            try:  # the holder deletes the file when it finishes: make sure ours is still the file
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)  # (a killed plain run's name goes: shared holders leave the file empty)
        if not self.shared:
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode())
        self._fd, self._path = fd, path
        return self

    def __exit__(self, exc_type, *exc) -> None:
        try:
            self._release()
        finally:
            if exc_type is not None:  # a refused or failed run leaves no empty directory it made
                for made in self._made:
                    try:
                        os.rmdir(made)
                    except OSError:  # not empty (the run wrote there), or gone
                        break
            self._made = []

    def _release(self) -> None:
        if self._fd is None:
            return
        if self.shared:  # the last shared holder out removes the file: it alone can take the lock whole
            import fcntl

            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                last = True
            except OSError:
                last = False
        if not self.shared or last:
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass
        os.close(self._fd)  # releases the lock
        self._fd = self._path = None


def refuse_a_file_as_output(output: str) -> None:
    """:class:`OutputError` when a local ``output`` given to ``prepare`` is a file, named as the
    user spelt the flag (``--output_file`` on Google's command line)."""
    from mlm_pipeline.config import flag_for

    if fs.is_local(output) and os.path.isfile(fs.get_fs(output)[1]):
        raise OutputError(f"the output {output} is a file, not a directory: give a directory for "
                          f"{flag_for('output')} (it receives the shards, the task markers and manifest.json)")


def _missing_dirs(directory: str) -> list[str]:
    """``directory`` and each of its parents that does not exist yet, deepest first."""
    missing = []
    path = os.path.abspath(directory)
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


LOCK_TRIES = 10  # 50 ms apart: the last shared holder out holds the lock whole for a moment


def _flock(fd: int, mode: int) -> None:
    """``flock(fd, mode)``, not waiting, tried a few times before ``BlockingIOError``: a sharing
    worker on its way out takes the lock whole for an instant (to remove the file if it is the
    last), which is no holder to refuse a run for."""
    import fcntl

    for attempt in range(LOCK_TRIES):
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt == LOCK_TRIES - 1:
                raise
            time.sleep(0.05)


def _describe(data: bytes) -> str:
    if not data:  # shared holders write nothing
        return "array or claim workers"
    try:
        holder = json.loads(data)
        return f"pid {holder['pid']} on {holder['host']}, started {holder['started']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"
