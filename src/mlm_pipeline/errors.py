"""The errors a user sees: each says what is wrong and what to do; the CLI prints it as ``error: ...``
without a traceback (a refused rerun lists each difference on a line of its own).

They live here, below every other module, so that any layer can raise them without importing
the layer that defines them (``fs`` raising ``InputError`` used to import the readers).
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every user-facing error of mlm-pipeline (the CLI prints it without traceback and exits 2,
    or 1 where a run's task failed otherwise than on its input, or a run to finalize is incomplete)."""


class ConfigError(PipelineError, ValueError):
    """A setting is invalid; the message says which and why."""


class InputError(PipelineError, ValueError):
    """A user-facing problem with an input (missing, unreadable, not of the stated format)."""


class OutputError(PipelineError, ValueError):
    """The output location cannot be used (unwritable, or holds a run with other settings)."""


class TokenizerError(PipelineError, ValueError):
    """The tokenizer could not be loaded or lacks a token the pipeline needs."""


class InspectError(PipelineError, ValueError):
    """A file or directory is not a readable output of mlm-pipeline."""


class ShardDamaged(PipelineError, ValueError):
    """A shard cannot be read as its format (truncated, corrupted, missing); the message names it."""

    def __init__(self, url: str, cause: BaseException):
        what = "missing" if isinstance(cause, FileNotFoundError) else f"damaged ({type(cause).__name__}: {cause})"
        super().__init__(f"shard {url} is {what}; check the whole output with: mlm-pipeline verify OUTPUT")
        self.url = url
        self.cause = cause


class IncompleteRun(PipelineError, RuntimeError):
    """Some tasks have no marker yet; ``missing`` lists their ids."""

    def __init__(self, output: str, missing: list[str], total: int):
        shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
        super().__init__(f"{output}: {len(missing)} of {total} tasks are not complete yet ({shown})")
        self.missing = missing
        self.total = total


class TaskFailed(PipelineError, RuntimeError):
    """A task raised; the message names the task and its input piece."""

    def __init__(self, task, cause: BaseException):
        super().__init__(f"task {task.task_id} ({task.describe()}) failed: {type(cause).__name__}: {cause}")
        self.task = task
        self.cause = cause
        self.outcome: str | None = None  # set once the failure was logged: how the run went, the rest


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop as on Ctrl-C (running tasks are stopped, completed ones kept)."""
