"""Array mode as a task filter: worker ``rank`` of ``count`` runs its deterministic share of the tasks.

``--task-rank I --task-count N`` selects the tasks whose plan index is ``I mod N`` (round robin,
so big and small files spread evenly); the driver applies the filter before handing the tasks to
any executor, so N array jobs can each run their share on a local pool or on Ray. Every worker
plans the same tasks from the same inputs (the plan fingerprint in the run record checks it), so
no coordination is needed; the first worker to see every task done writes the manifest
(:func:`mlm_pipeline.run.manifest.finalize_if_complete`).

The rank and count default to a Slurm job array's ``SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN``
and ``SLURM_ARRAY_TASK_COUNT``, or the rank to a Kubernetes Indexed Job's
``JOB_COMPLETION_INDEX`` (give ``--task-count`` = the Job's ``completions``).
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from mlm_pipeline.plan import Task


def task_share(tasks: Sequence[Task], rank: int, count: int) -> list[Task]:
    """The tasks of worker ``rank`` of ``count``: plan index ``rank mod count``, in plan order."""
    return [t for t in tasks if t.index % count == rank]


def array_from_env(task_rank: int | None, task_count: int | None,
                   environ: Mapping[str, str] = os.environ) -> tuple[int | None, int | None]:
    """(rank, count) from flags, completed from Slurm / Kubernetes variables; (None, None): off."""

    def _int(name: str) -> int | None:
        value = environ.get(name)
        if value is None or value == "":
            return None
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not an integer") from None

    slurm_id, slurm_count = _int("SLURM_ARRAY_TASK_ID"), _int("SLURM_ARRAY_TASK_COUNT")
    if task_count is None and slurm_count is not None:
        task_count = slurm_count
    if task_count is None:
        if task_rank is not None:
            raise ValueError("--task-rank needs --task-count")
        return None, None
    if task_rank is None:
        if slurm_id is not None:
            task_rank = slurm_id - (_int("SLURM_ARRAY_TASK_MIN") or 0)
        elif _int("JOB_COMPLETION_INDEX") is not None:
            task_rank = _int("JOB_COMPLETION_INDEX")
        else:
            raise ValueError("--task-count needs --task-rank (or SLURM_ARRAY_TASK_ID / JOB_COMPLETION_INDEX)")
    return task_rank, task_count


__all__ = ["array_from_env", "task_share"]
