"""Progress of long runs: a live bar on a terminal, plain periodic log lines otherwise.

The bar is redrawn from the updates themselves, at most every :data:`REDRAW_SECONDS`, not by
rich's refresh thread: a process with a thread of its own spawns its pool workers instead of
forking them (:func:`mlm_pipeline.executors.local.start_method`), which costs each worker a
quarter second to start. Updates arrive at least twice a second while tasks run. rich is imported
only where progress is shown (``--no-progress``: not at all).
"""

from __future__ import annotations

import time

from mlm_pipeline.executors.base import PROGRESS_TASK

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
        self._shown_bytes = 0  # the bar never goes back
        self._by_task: dict[str, list[int]] = {}  # running task -> its bytes, documents, tokens so far
        self.start = time.time()
        self._last_line = self.start
        self._bar = None
        self._drawn = 0.0
        self._task = None

    def __enter__(self) -> "Progress":
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)

        console = Console(file=self.stream)
        if console.is_terminal:
            self._bar = RichProgress(
                TextColumn("[bold]prepare"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TextColumn("{task.fields[docs]:,} docs  {task.fields[tps]:,.0f} tok/s  tasks {task.fields[tasks]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
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
        counts = [int(delta.get(k, 0)) for k in ("bytes", "documents", "tokens")]
        if (task := delta.get(PROGRESS_TASK)) is not None:
            so_far = self._by_task.setdefault(task, [0, 0, 0])
            so_far[:] = [a + b for a, b in zip(so_far, counts)]
        self._add(*counts)
        self._refresh()

    def _add(self, nbytes: int, documents: int, tokens: int) -> None:
        self.bytes += nbytes
        self.documents += documents
        self.tokens += tokens

    def task_done(self, marker: dict) -> None:
        """A task is done: what it counted, over all its tries, is replaced by its final counts,
        its bytes by its planned input bytes. A task's reader counts the bytes of the documents it
        owns, which cross its range's edges (only the tasks of a whole file tile it), so a resumed
        run, which runs some tasks, ended short of 100%; a task run again (its worker died, it
        stalled) counted its first try's documents twice."""
        self.tasks += 1
        stats = marker.get("stats", {})
        reported = self._by_task.pop(marker.get("task_id"), None)
        if reported is None:  # an executor that does not name tasks: its last try's counts
            reported = [stats.get("bytes_read", 0), stats.get("documents_read", 0), stats.get("tokens", 0)]
        final = [marker.get("task", {}).get("input_bytes", reported[0]), stats.get("documents_read", reported[1]),
                 stats.get("tokens", reported[2])]
        self._add(*(f - r for f, r in zip(final, reported)))
        self._refresh()

    def _shown(self) -> int:
        """Bytes to show: the count, never less than shown before (a task that read past its
        range is brought back to its planned bytes when it ends), never above the total."""
        self._shown_bytes = min(self.total_bytes, max(self._shown_bytes, self.bytes))
        return self._shown_bytes

    def _refresh(self) -> None:
        if not self.enabled:
            return
        elapsed = max(1e-9, time.time() - self.start)
        if self._bar is not None:
            self._bar.update(
                self._task,
                completed=self._shown(),
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
        shown = self._shown()
        frac = shown / self.total_bytes
        eta = (elapsed / frac - elapsed) if frac > 0 else float("nan")
        print(
            f"prepare: {frac:6.1%} {shown / 1e6:,.1f}/{self.total_bytes / 1e6:,.1f} MB, "
            f"{self.documents:,} docs, {self.tokens / elapsed:,.0f} tokens/s, tasks {self._tasks_text()}, "
            + (final or f"ETA {eta:,.0f}s"),
            file=self.stream,
            flush=True,
        )
        self._last_line = time.time()
