"""The errors a user sees: each says what is wrong and what to do; the CLI prints it as ``error: ...``
without a traceback (a refused rerun lists each difference on a line of its own).

They live here, below every other module, so that any layer can raise them without importing
the layer that defines them (``fs`` raising ``InputError`` used to import the readers).
"""

from __future__ import annotations

import re

# the user-info part of a URL (``s3://user:password@bucket``): up to the last ``@`` of the authority
_URL_USER_INFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*://)[^/\s]*@")


def redact_credentials(text: str) -> str:
    """``text`` with every URL's user-info replaced by ``***`` (``s3://***@bucket/x``): for any
    message that may quote a URL as given."""
    return _URL_USER_INFO.sub(r"\1***@", text)


def url_credentials_message(url: str) -> str | None:
    """Why a URL that holds credentials (``scheme://user:password@host``) is refused, quoting it
    redacted; None for any other string (local paths with an ``@`` included)."""
    if "://" not in url or "@" not in url.split("://", 1)[1].split("/", 1)[0]:
        return None
    return (f"{redact_credentials(url)} holds credentials (user:password@): give them through the storage "
            "client's own chain (environment variables, ~/.aws or ~/.config files, instance roles), never in a URL, "
            "where logs, the manifest and error messages would keep them")


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
