"""Progress of long runs: a live bar on a terminal, plain periodic log lines otherwise.

The bar is redrawn from the updates themselves, at most every :data:`REDRAW_SECONDS`, not by
rich's refresh thread: a process with a thread of its own spawns its pool workers instead of
forking them (:func:`mlm_pipeline.executors.local.start_method`), which costs each worker a
quarter second to start. Updates arrive at least twice a second while tasks run.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress as RichProgress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

REDRAW_SECONDS = 0.1


class Progress:
    """Counts input bytes, documents and tokens; shows them as a bar or as log lines."""

    def __init__(self, *, total_bytes: int, total_tasks: int, enabled: bool, stream, interval: float = 10.0):
        self.total_bytes = max(1, total_bytes)
        self.total_tasks = total_tasks
        self.enabled = enabled
        self.stream = stream
        self.interval = interval
        self.bytes = self.documents = self.tokens = self.tasks = 0
        self.start = time.time()
        self._last_line = self.start
        self._console = Console(file=stream)
        self._bar = None
        self._drawn = 0.0
        self._task = None

    def __enter__(self) -> "Progress":
        if self.enabled and self._console.is_terminal:
            self._bar = RichProgress(
                TextColumn("[bold]prepare"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TextColumn("{task.fields[docs]:,} docs  {task.fields[tps]:,.0f} tok/s  tasks {task.fields[tasks]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self._console,
                transient=False,
                auto_refresh=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("prepare", total=self.total_bytes, docs=0, tps=0.0, tasks=self._tasks_text())
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.enabled and self.total_tasks:
            self._line(final="done" if exc_type is None else
                       "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "stopped by an error")

    def _tasks_text(self) -> str:
        return f"{self.tasks}/{self.total_tasks}"

    def update(self, delta: dict) -> None:
        self.bytes += int(delta.get("bytes", 0))
        self.documents += int(delta.get("documents", 0))
        self.tokens += int(delta.get("tokens", 0))
        self._refresh()

    def task_done(self, marker: dict) -> None:
        """A task is done: its bytes now count as its planned input bytes. A task's reader counts
        the bytes of the documents it owns, which cross its range's edges (only the tasks of a
        whole file tile it), so a resumed run, which runs some tasks, ended short of 100%."""
        self.tasks += 1
        planned, read = marker.get("task", {}).get("input_bytes"), marker.get("stats", {}).get("bytes_read")
        if planned is not None and read is not None:
            self.bytes += planned - read
        self._refresh()

    def _refresh(self) -> None:
        if not self.enabled:
            return
        elapsed = max(1e-9, time.time() - self.start)
        if self._bar is not None:
            self._bar.update(
                self._task,
                completed=min(self.bytes, self.total_bytes),
                docs=self.documents,
                tps=self.tokens / elapsed,
                tasks=self._tasks_text(),
            )
            now = time.monotonic()
            if now - self._drawn >= REDRAW_SECONDS:  # (stopping the bar draws its last state)
                self._bar.refresh()
                self._drawn = now
        elif time.time() - self._last_line >= self.interval:
            self._line()

    def _line(self, final: str = "") -> None:
        """A progress line; ``final``: how the run ended (``done``, ``interrupted`` ...), else an ETA."""
        elapsed = max(1e-9, time.time() - self.start)
        frac = min(1.0, self.bytes / self.total_bytes)
        eta = (elapsed / frac - elapsed) if frac > 0 else float("nan")
        print(
            f"prepare: {frac:6.1%} {self.bytes / 1e6:,.1f}/{self.total_bytes / 1e6:,.1f} MB, "
            f"{self.documents:,} docs, {self.tokens / elapsed:,.0f} tokens/s, tasks {self._tasks_text()}, "
            + (final or f"ETA {eta:,.0f}s"),
            file=self.stream,
            flush=True,
        )
        self._last_line = time.time()
