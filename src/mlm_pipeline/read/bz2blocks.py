"""Reading a bzip2 file from any byte offset: the blocks that a byte range owns.

Why: a Wikipedia dump is one bz2 file of many GB; to share it among workers without a
decompressed copy, each worker must start decoding in the middle. bzip2 makes that possible:
a file is a run of *streams* (``BZh`` + level digit), each a run of *blocks* that begin with
the 48-bit magic ``0x314159265359`` at any **bit** offset and decode on their own (each carries
its CRC); a stream ends with the 48-bit magic ``0x177245385090``, a 32-bit CRC and zero bits up
to a byte boundary. (``indexed_bzip2`` can list block offsets too, but only by decoding the
whole file first; here nothing is decoded at planning time.)

Ownership: a byte range ``[s, e)`` owns the blocks whose magic starts at a bit in
``[8s, 8e)``. Its reader finds the first block start at or after bit ``8s`` by searching the
magic (byte-wise ``bytes.find`` of the 8 bit-shifted patterns) and decodes from there: the
bits from that block on are shifted to a byte boundary behind a ``BZh9`` header and fed to the
standard library's decompressor, each run of blocks up to the stream's end marker (or up to the
first block the range does not own) followed by the 48 bits of the next magic, so libbz2 emits
every block whole and checks every block CRC, without ever reading a stream CRC it could not
know. A magic found inside compressed data by chance (about one per 2**48 bits) is not a block
start: a candidate counts only if decoding from it yields data, and the reader of the range
before applies the same test to find where its blocks end, so both agree. What follows the
owned blocks is decoded on request (flagged ``owned=False``), so a reader can finish a record
that crosses the boundary.

A range made of whole streams (a multistream dump cut at the offsets of its index, or a whole
file) is decoded by ``whole_streams`` with ``indexed_bzip2`` instead: about 1.4x the standard
library's speed on one core, measured on the bundled dump excerpt (``benchmarks/
wikidump_bench.py``). It cannot start inside a stream, hence the standard library above.

A stream that ends without its end marker (a truncated file) or a block that fails its CRC
raises ``InputError`` naming the file and the compressed byte offset.
"""

from __future__ import annotations

import atexit
import bz2
import io
import re
import weakref
from typing import BinaryIO, Iterator

from mlm_pipeline.errors import InputError

BLOCK_MAGIC = 0x314159265359
EOS_MAGIC = 0x177245385090
MAGIC_BITS = 48

READ_BYTES = 1 << 20
"""Compressed bytes read at a time."""

FEED_BYTES = 256 * 1024
"""Compressed bytes given to the decompressor at a time."""

_HEADER = re.compile(rb"BZh[1-9]")


class _Pattern:
    """A 48-bit magic at each of the 8 bit offsets within a byte, searchable with ``find``."""

    def __init__(self, magic: int) -> None:
        self.shifts = []
        for k in range(8):
            value = magic << (8 - k)  # the magic at bit k of a 7-byte window
            mask = ((1 << MAGIC_BITS) - 1) << (8 - k)
            window = value.to_bytes(7, "big")
            core, skip = (window[0:6], 0) if k == 0 else (window[1:6], 1)
            self.shifts.append((k, core, skip, value, mask))


_BLOCK = _Pattern(BLOCK_MAGIC)
_EOS = _Pattern(EOS_MAGIC)


class BitWindow:
    """The compressed bytes of a file from ``start`` on, read forward on demand and addressed
    by absolute byte or bit offset; bytes before ``release``'s offset are forgotten."""

    def __init__(self, f: BinaryIO, start: int, url: str, limit: int | None = None) -> None:
        start = max(0, start - 8)  # room to see a stream header just before ``start``
        f.seek(start)
        self._f = f
        self.url = url
        self.base = start
        self.buf = bytearray()
        self.eof = False
        self.limit = limit  # the file is read as if it ended here (None: at its end)

    def end(self) -> int:
        """Absolute offset just past the bytes held."""
        return self.base + len(self.buf)

    def fill(self, upto: int) -> int:
        """Hold bytes up to absolute offset ``upto`` if the file has them; return ``end()``."""
        while self.end() < upto and not self.eof:
            want = max(READ_BYTES, upto - self.end())
            if self.limit is not None:
                want = min(want, self.limit - self.end())
            data = self._f.read(want) if want > 0 else b""
            if not data:
                self.eof = True
                break
            self.buf += data
        return self.end()

    def release(self, before: int) -> None:
        drop = before - self.base
        if drop >= READ_BYTES:
            del self.buf[:drop]
            self.base += drop

    def at_end(self, offset: int) -> bool:
        """Whether the file ends exactly at ``offset``."""
        return self.fill(offset + 1) <= offset

    def byte_slice(self, a: int, b: int) -> bytes:
        self.fill(b)
        return bytes(self.buf[a - self.base : b - self.base])

    def bits(self, a: int, b: int) -> bytes:
        """Bits ``[a, b)`` as bytes, left-aligned, padded with zero bits to a whole byte."""
        n = (b - a + 7) // 8
        first = a // 8
        raw = self.byte_slice(first, first + n + 1)
        shift = a % 8
        if shift == 0 and (b - a) % 8 == 0:
            return raw[:n]
        value = int.from_bytes(raw, "big") << (8 * (n + 1 - len(raw)))  # zero bits past EOF
        value = (value >> (8 - shift)) & ((1 << (8 * n)) - 1)
        pad = 8 * n - (b - a)
        return ((value >> pad) << pad).to_bytes(n, "big")

    def find(self, pattern: _Pattern, lo: int, hi: int | None) -> int | None:
        """The first bit offset in ``[lo, hi)`` (``hi=None``: up to the end of the file) where
        ``pattern``'s magic starts, or None."""
        step = 8 * READ_BYTES
        while True:
            top = lo + step if hi is None else hi
            found = self._find_in(pattern, lo, top)
            if found is not None or hi is not None:
                return found
            if self.eof and self.end() * 8 <= top:
                return None
            lo = top

    def _find_in(self, pattern: _Pattern, lo: int, hi: int) -> int | None:
        if hi <= lo:
            return None
        first = lo // 8
        self.fill(hi // 8 + 8)
        start = max(first - self.base, 0)
        stop = min(hi // 8 + 7, self.end()) - self.base  # a magic starting before hi ends here
        buf = self.buf
        best = None
        for k, core, skip, value, mask in pattern.shifts:
            j = buf.find(core, start, stop)
            while j >= 0:
                i = j - skip
                bit = 8 * (self.base + i) + k
                if bit >= hi or (best is not None and bit >= best):
                    break
                if bit >= lo and i >= 0:
                    window = bytes(buf[i : i + 7]).ljust(7, b"\0")
                    if int.from_bytes(window, "big") & mask == value:
                        best = bit
                        break
                j = buf.find(core, j + 1, stop)
        return best

    def magic_at(self, bit: int) -> int | None:
        """The 48-bit value starting at ``bit``, or None past the end of the file."""
        if self.fill((bit + MAGIC_BITS + 7) // 8) * 8 < bit + MAGIC_BITS:
            return None
        return int.from_bytes(self.bits(bit, bit + MAGIC_BITS), "big")

    def stream_end_after(self, eos: int) -> int | None:
        """Where the stream whose end magic starts at bit ``eos`` is followed by something:
        the byte offset of the next stream header (or of the file end); None if ``eos`` is not
        an end marker (its padding is not zero or no header follows)."""
        crc_end = eos + MAGIC_BITS + 32
        after = (crc_end + 7) // 8
        if crc_end % 8:
            last = self.byte_slice(after - 1, after)
            if not last or last[0] & ((1 << (8 - crc_end % 8)) - 1):
                return None
        if self.at_end(after):
            return after
        if _HEADER.match(self.byte_slice(after, after + 4)) is None:
            return None
        return after

    def follows_header(self, bit: int) -> bool:
        """Whether ``bit`` is right after a stream header (a stream's first block)."""
        byte = bit // 8
        return bit % 8 == 0 and byte - 4 >= self.base and bool(
            _HEADER.fullmatch(self.byte_slice(byte - 4, byte))
        )


class _Failure(Exception):
    """An ``InputError`` met while decoding, kept apart until the caller knows whether it is
    one (corrupt data) or only shows that a candidate block start was a chance match."""

    def __init__(self, error: InputError) -> None:
        super().__init__(str(error))
        self.error = error


class _Corrupt(_Failure):
    """libbz2 rejected the data."""


class _Truncated(_Failure):
    """The file ends inside a stream."""


class _Run:
    """One decompressor fed the consecutive blocks of one stream, from a block start."""

    def __init__(self, window: BitWindow, start: int) -> None:
        self.window = window
        self.start = start
        self.fed = start  # bits before this one were fed
        self.done = False
        self.eos: int | None = None  # bit of the stream's end magic, once reached
        self._d = bz2.BZ2Decompressor()
        self._d.decompress(b"BZh9")

    def _decompress(self, data: bytes, upto: int) -> bytes:
        try:
            return self._d.decompress(data)
        except (OSError, EOFError, ValueError) as exc:
            raise _Corrupt(
                InputError(
                    f"{self.window.url}: corrupt bz2 data between compressed byte offsets "
                    f"{self.fed // 8} and {(upto + 7) // 8} ({exc})"
                )
            ) from exc

    def step(self, limit: int | None = None) -> bytes:
        """Feed the next bytes (no further than bit ``limit``); at the stream's end marker,
        feed through its magic and finish. Returns what was decoded."""
        w = self.window
        hi = self.fed + 8 * FEED_BYTES
        if limit is not None:
            hi = min(hi, limit)
        eos = _stream_end(w, self.fed, hi)
        if eos is not None:
            self.eos = eos
            return self.finish(eos)
        hi = min(hi, 8 * w.fill(hi // 8 + 1) - 8)  # one byte more is read by ``bits``
        hi -= (hi - self.fed) % 8
        if hi <= self.fed:
            if w.eof and limit is None:
                raise _Truncated(
                    InputError(
                        f"{w.url}: truncated bz2 data: the file ends at byte {w.end()} inside "
                        f"the stream that holds the block at compressed byte offset "
                        f"{self.start // 8}; the file is incomplete"
                    )
                )
            return b""
        data = w.bits(self.fed, hi)
        out = self._decompress(data, hi)
        self.fed = hi
        return out

    def finish(self, stop: int) -> bytes:
        """Feed up to bit ``stop`` (a block or end magic) and that magic's 48 bits: libbz2 then
        emits every block before ``stop`` whole (and checks its CRC)."""
        data = self.window.bits(self.fed, stop + MAGIC_BITS)
        out = [self._decompress(data, stop)]
        while True:  # CPython returns at most one buffer's worth once the input is used up
            more = self._decompress(b"", stop)
            if not more:
                break
            out.append(more)
        self.fed = stop
        self.done = True
        return b"".join(out)


def _stream_end(window: BitWindow, lo: int, hi: int | None) -> int | None:
    """The first end-of-stream marker starting in ``[lo, hi)`` (``hi=None``: to the file end)."""
    eos = window.find(_EOS, lo, hi)
    while eos is not None and window.stream_end_after(eos) is None:
        eos = window.find(_EOS, eos + 1, hi)  # a chance match inside a block
    return eos


def _probe(window: BitWindow, bit: int) -> tuple[_Run, bytes] | None:
    """A run started at candidate block start ``bit`` and its first output, or None if the
    candidate is not a block start: decoding from it fails or yields nothing. A stream's
    first block is certain, so there a failure is corrupt data and raises ``_Corrupt``;
    ``_Truncated`` always passes through."""
    run = _Run(window, bit)
    try:
        while not run.done:
            out = run.step()
            if out:
                return run, out
    except _Corrupt:
        if window.follows_header(bit):
            raise
        return None
    if window.follows_header(bit):
        raise _Corrupt(
            InputError(f"{window.url}: empty bz2 block at compressed byte offset {bit // 8}")
        )
    return None


def _first_block(window: BitWindow, lo: int, hi: int | None) -> tuple[_Run, bytes] | None:
    """The run from the first block start in ``[lo, hi)``, with its first output."""
    bit = lo
    while True:
        bit = window.find(_BLOCK, bit, hi)
        if bit is None:
            return None
        found = _probe(window, bit)
        if found is not None:
            return found
        bit += 1


def _next_stream(window: BitWindow, eos: int) -> int | None:
    """The first block of the stream after the one ending at ``eos``; None at the file end."""
    while True:
        after = window.stream_end_after(eos)
        if after is None or window.at_end(after):
            return None
        first = 8 * (after + 4)
        magic = window.magic_at(first)
        if magic == BLOCK_MAGIC:
            return first
        if magic != EOS_MAGIC:
            raise InputError(
                f"{window.url}: not bz2 data after the stream header at compressed byte "
                f"offset {after}"
            )
        eos = first  # an empty stream


def owned_blocks(
    f: BinaryIO, url: str, start: int, end: int | None, limit: int | None = None
) -> Iterator[tuple[bytes, bool]]:
    """Decoded data of the blocks that compressed byte range ``[start, end)`` owns, as
    ``(data, True)`` chunks, then of the blocks after them as ``(data, False)`` for as long as
    the caller keeps reading (``end=None``: to the end of the file, all owned).

    Raises ``InputError`` for corrupt or truncated bz2 data (naming ``url`` and the offset).
    When the file is cut inside the first block after the owned ones, the owned data still
    comes whole, followed by an empty ``(b"", False)``; the error is raised only if the caller
    reads on. ``limit``: the file is read as if it ended there (``data_end``).
    """
    try:
        yield from _owned_blocks(BitWindow(f, start, url, limit), start, end)
    except _Failure as exc:
        raise exc.error from exc.__cause__


def _owned_blocks(window: BitWindow, start: int, end: int | None) -> Iterator[tuple[bytes, bool]]:
    lo, hi = 8 * start, (None if end is None else 8 * end)
    found = _first_block(window, lo, hi)
    if found is None:
        return
    run, out = found
    if hi is not None and run.fed > hi:
        # the probe fed past hi, where the owned blocks may end: decode them again with a run
        # that can stop at the first block start from hi on
        run, out = _Run(window, run.start), b""
    owned = True
    if out:
        yield out, True
    while True:
        window.release(run.fed // 8 - 16)
        if run.done:
            first = _next_stream(window, run.eos)
            if first is None:
                return
            if owned and hi is not None and first >= hi:
                owned = False
            run = _Run(window, first)
            continue
        if not owned or hi is None or run.fed + 8 * FEED_BYTES < hi:
            out = run.step()
            if out:
                yield out, owned
            continue
        # the owned blocks end at the first block start at or after bit hi
        while not run.done and hi - run.fed >= 8:
            out = run.step(limit=hi)
            if out:
                yield out, True
        if run.done:
            continue
        try:
            eos, nxt = _next_boundary(window, run, hi)
        except _Truncated as exc:  # cut inside the next block: ours are whole
            out = run.finish(exc.bit)
            if out:
                yield out, True
            yield b"", False
            raise
        if eos is not None:  # the stream ends first: the next one starts past hi
            run.eos = eos
            out = run.finish(eos)
            if out:
                yield out, True
            continue
        if nxt is None:  # no block starts from hi on: the rest of this run is owned
            hi = None
            continue
        out = run.finish(nxt[0].start)
        if out:
            yield out, True
        run, out = nxt
        owned = False
        yield out, False


def _next_boundary(
    window: BitWindow, run: _Run, hi: int
) -> tuple[int | None, tuple[_Run, bytes] | None]:
    """Where the blocks of ``run`` owned by a range ending at bit ``hi`` stop: ``(eos, None)``
    if the stream's end marker comes before any block start at or after ``hi``; else
    ``(None, (next_run, its first output))`` for that first block start; ``(None, None)`` if
    no block starts after ``hi``. A ``_Truncated`` raised here carries the candidate's bit."""
    bit = hi
    while True:
        bit = window.find(_BLOCK, bit, None)
        eos = _stream_end(window, run.fed, bit)
        if eos is not None:
            return eos, None
        if bit is None:
            return None, None
        try:
            found = _probe(window, bit)
        except _Truncated as exc:
            exc.bit = bit
            raise
        if found is not None:
            return None, found
        bit += 1


class _Range(io.RawIOBase):
    """Bytes ``[start, end)`` of a seekable file, as a file of their own."""

    def __init__(self, f: BinaryIO, start: int, end: int) -> None:
        super().__init__()
        self._f = f
        self._start = start
        self._size = end - start
        self._pos = 0
        f.seek(start)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, self._size)[whence]
        self._pos = max(0, min(base + offset, self._size))
        self._f.seek(self._start + self._pos)
        return self._pos

    def readinto(self, b) -> int:
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        data = self._f.read(n)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


_OPEN: weakref.WeakSet = weakref.WeakSet()


def _close_open() -> None:
    for stream in list(_OPEN):
        stream.close()


atexit.register(_close_open)


def _closed_at_exit(stream):
    """Register an ``indexed_bzip2`` file to be closed at interpreter exit: one left open (a
    reader generator abandoned without ``close``) aborts the process while Python finalizes
    (its decoder thread is still running)."""
    _OPEN.add(stream)
    return stream


def whole_streams(
    f: BinaryIO, url: str, start: int, end: int | None, limit: int | None = None
) -> Iterator[tuple[bytes, bool]]:
    """Like ``owned_blocks`` for a range made of whole streams (``start`` and ``end`` are
    stream starts or the file ends, as a multistream index gives them): the owned streams are
    decoded with ``indexed_bzip2`` (faster than the standard library by about a third on one
    core), the blocks after ``end`` as ``owned_blocks`` does."""
    import indexed_bzip2

    f.seek(0, 2)
    stop = (f.tell() if limit is None else min(limit, f.tell())) if end is None else end
    try:
        stream = indexed_bzip2.open(_Range(f, start, stop), parallelization=1)
        with _closed_at_exit(stream):
            while True:
                data = stream.read(READ_BYTES)
                if not data:
                    break
                yield data, True
    except (RuntimeError, ValueError, OSError) as exc:
        # indexed_bzip2 does not say where: decode again with the standard library, which does
        for data, owned in owned_blocks(f, url, start, end, limit):
            if not owned:
                break
        raise InputError(
            f"{url}: corrupt bz2 data in compressed bytes [{start}, {stop}) ({exc})"
        ) from exc
    if end is not None:
        yield b"", False  # the owned data ends here, before any error in what follows
        for data, _ in owned_blocks(f, url, end, None, limit):
            yield data, False


TAIL_BYTES = 1 << 20
"""How far from its end a file is searched for the end of its last stream (``data_end``)."""


def data_end(f: BinaryIO, url: str, size: int) -> int:
    """Where the bz2 data of a file ends: ``size``, or the end of its last stream when bytes
    that are not a stream follow it (trailing garbage, which ``bzip2 -d`` ignores with a
    warning; ``indexed_bzip2`` and the standard library's ``BZ2File`` ignore it too, but a
    reader entering the file in the middle took it for a corrupt block).

    The last stream's end marker is looked for in the last ``TAIL_BYTES`` of the file: the last
    48-bit end magic there followed by zero padding bits. Bytes after it that begin with a
    stream header (``BZh1``-``BZh9``) are a stream, maybe truncated: not garbage, left to the
    reader, which names what is wrong with them."""
    lo = max(0, size - TAIL_BYTES)
    f.seek(lo)
    tail = f.read(size - lo)
    window = BitWindow(io.BytesIO(tail), 0, url)
    last = None
    bit = 0
    while (eos := window.find(_EOS, bit, None)) is not None:
        crc_end = eos + MAGIC_BITS + 32
        after = (crc_end + 7) // 8
        if after <= len(tail) and (crc_end % 8 == 0 or not tail[after - 1] & ((1 << (8 - crc_end % 8)) - 1)):
            last = after
        bit = eos + 1
    if last is None or last == len(tail) or _HEADER.match(tail, last):
        return size
    return lo + last
