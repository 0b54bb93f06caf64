"""A fault-injecting HTTP proxy on 127.0.0.1 between the pipeline and a real S3 server.

Every request is sent on its own connection (the proxy adds ``Connection: close``), and the proxy
decides per connection, by a fixed cycle, whether to pass it on or to inject one fault:

* ``reset``: the connection is reset (RST) before any answer;
* ``500`` / ``503``: an S3 error answer (``InternalError`` / ``SlowDown``) instead of the server's;
* ``slow``: the request waits ``slow_seconds`` before it is passed on;
* ``cut-upload``: a request with a body is passed on until half its body went through, then both
  connections are reset (an upload that fails midway); requests without a body pass;
* ``lose-answer``: a request with a body is passed on whole and the server answers it (the write
  is done), but the client's connection is reset instead of getting the answer, so the client
  retries a write that succeeded; requests without a body pass.

``injected`` counts the faults of each kind that were injected; ``budget`` bounds their total.
``only``, if given, picks the requests the cycle applies to by their head (request line and
headers); the others pass untouched and take no turn of the cycle.
"""

from __future__ import annotations

import collections
import itertools
import socket
import struct
import threading
import time
from typing import Callable

ERRORS = {
    "500": (b"500 Internal Server Error", b"InternalError", b"We encountered an internal error. Please try again."),
    "503": (b"503 Slow Down", b"SlowDown", b"Please reduce your request rate."),
}


def _rst(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b"", b""
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    return head + b"\r\n\r\n", rest


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def _close_after(head: bytes) -> bytes:
    lines = [line for line in head[:-4].split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join(lines + [b"Connection: close"]) + b"\r\n\r\n"


class FaultyProxy:
    def __init__(self, upstream: str, cycle: list[str], *, budget: int, slow_seconds: float = 1.5,
                 only: Callable[[bytes], bool] | None = None):
        host, port = upstream.rsplit("//", 1)[-1].rsplit(":", 1)
        self.upstream = (host, int(port))
        self._cycle = itertools.cycle(cycle)
        self.budget = budget
        self.slow_seconds = slow_seconds
        self.only = only
        self.injected: collections.Counter[str] = collections.Counter()
        self.requests = 0
        self._cut_pending = False
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stopped = True
        self._server.close()

    def _decide(self, has_body: bool) -> str:
        """The fault for the next request. A ``cut-upload`` drawn for a request without a body
        waits for the next one with a body, so that the cycle's cuts happen whatever the mix of
        reads and writes."""
        with self._lock:
            self.requests += 1
            kind = next(self._cycle)
            if sum(self.injected.values()) >= self.budget:
                return "ok"
            if kind == "cut-upload" and not has_body:
                self._cut_pending = True
                return "ok"
            if kind == "ok" and self._cut_pending and has_body:
                self._cut_pending = False
                return "cut-upload"
            return kind

    def _count(self, kind: str) -> None:
        with self._lock:
            self.injected[kind] += 1

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        try:
            head, rest = _read_head(client)
            if not head:
                client.close()
                return
            length = int(_header(head, b"content-length") or 0)
            kind = self._decide(has_body=length > 1) if self.only is None or self.only(head) else "ok"
            if kind == "reset":
                self._count(kind)
                _rst(client)
                return
            if kind in ERRORS:
                self._count(kind)
                status, code, message = ERRORS[kind]
                body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>' + code + b"</Code><Message>"
                        + message + b"</Message></Error>")
                client.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/xml\r\nContent-Length: "
                               + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
                client.shutdown(socket.SHUT_WR)
                client.settimeout(2)
                try:
                    while client.recv(65536):  # let the client finish sending its body
                        pass
                except OSError:
                    pass
                client.close()
                return
            lose = kind == "lose-answer" and length > 1
            if lose:
                self._count(kind)
            if kind == "slow":
                self._count(kind)
                time.sleep(self.slow_seconds)
            cut = length // 2 if kind == "cut-upload" and length > 1 else None
            if cut is not None:
                self._count(kind)
            upstream = socket.create_connection(self.upstream)
            upstream.sendall(_close_after(head))
            self._pipe(client, upstream, rest, cut, lose)
        except OSError:
            _rst(client)

    def _pipe(self, client: socket.socket, upstream: socket.socket, rest: bytes, cut: int | None,
              lose: bool = False) -> None:
        def back() -> None:  # server -> client (with ``lose``: only "100 Continue", then a reset)
            pending = b""
            try:
                while True:
                    data = upstream.recv(65536)
                    if not data:
                        break
                    if not lose:
                        client.sendall(data)
                        continue
                    pending += data
                    while pending.startswith(b"HTTP/1.1 100") and (end := pending.find(b"\r\n\r\n")) >= 0:
                        client.sendall(pending[:end + 4])
                        pending = pending[end + 4:]
                    if pending and not pending.startswith(b"HTTP/1.1 100") and b"\r\n\r\n" in pending:
                        break  # the server answered (the write is done): the client never hears of it
            except OSError:
                pass
            finally:
                if lose:  # (shutdown first: it wakes the other thread's recv on this socket, so it closes now)
                    try:
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        client.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                else:
                    try:
                        client.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass

        thread = threading.Thread(target=back, daemon=True)
        thread.start()
        sent = 0
        try:
            data = rest
            while True:
                if data:
                    if cut is not None and sent + len(data) >= cut:
                        upstream.sendall(data[: cut - sent])
                        _rst(client)
                        _rst(upstream)
                        return
                    upstream.sendall(data)
                    sent += len(data)
                data = client.recv(65536)
                if not data:
                    break
            upstream.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        thread.join(120)
        client.close()
        upstream.close()
