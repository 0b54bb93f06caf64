"""The process environment mlm-pipeline relies on, set in one place.

Two variables matter, and both must be set before the library that reads them starts:

* ``AWS_ENDPOINT_URL``: an S3-compatible endpoint (``--s3-endpoint-url``). botocore reads it when a
  client is made, so every process that touches storage sets it first: the driver, the ``finalize``
  command, and each Ray task (a Ray worker is another process, on another machine, and gets the
  endpoint only through the config). Pool workers are spawned from the driver and inherit it.
* ``TOKENIZERS_PARALLELISM``: the Rust tokenizer's thread pool. A process that runs tasks uses one
  tokenizer thread (and one OpenMP thread), since executors run one task per core; so it is forced
  off in pool workers, Ray tasks and a driver that runs tasks itself. Elsewhere (``inspect``,
  training) it only defaults to off, keeping a user's own setting, which also silences the
  tokenizers' warning about a pool that a forked process would inherit.

Every entry point calls :func:`configure_process` (the CLI commands, :func:`~mlm_pipeline.pipeline.run_prepare`,
the local pool's worker initializer, the Ray task body, ``load_tokenizer``, the training entry).
"""

from __future__ import annotations

import os

ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL"
TOKENIZER_THREADS_VARIABLE = "TOKENIZERS_PARALLELISM"


def configure_process(s3_endpoint_url: str | None = None, *, runs_tasks: bool = False) -> None:
    """Set this process's environment (see the module docstring); safe to call more than once.

    ``runs_tasks``: this process runs pipeline tasks (one tokenizer thread and one OpenMP thread,
    forced). ``s3_endpoint_url``: use this S3-compatible endpoint (nothing changes when None).
    """
    if s3_endpoint_url:
        os.environ[ENDPOINT_VARIABLE] = s3_endpoint_url
    if runs_tasks:
        os.environ[TOKENIZER_THREADS_VARIABLE] = "false"
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    else:
        os.environ.setdefault(TOKENIZER_THREADS_VARIABLE, "false")


__all__ = ["configure_process"]
