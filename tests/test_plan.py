"""Planning: the task size derived from the input (``--split-size auto``) and what depends on it."""

from __future__ import annotations

import pytest

from conftest import SAMPLE_TEXT, VOCAB, WIKIEXTRACTOR, WIKITEXT
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.plan import auto_split_bytes, plan_tasks

MIB = 1 << 20


@pytest.mark.parametrize(
    "total, expected",
    [
        (0, 1 * MIB),
        (500_000, 1 * MIB),
        (32 * MIB, 1 * MIB),  # 32 tasks of 1 MiB
        (32 * MIB + 1, 2 * MIB),  # rounded up to whole MiB
        (200 * MIB, 7 * MIB),  # 6.25 MiB -> 7 MiB: 29 tasks
        (1 << 30, 32 * MIB),
        (2 << 30, 64 * MIB),
        (500 << 30, 64 * MIB),  # big corpora: 64 MiB tasks
    ],
)
def test_auto_split_bytes(total, expected):
    assert auto_split_bytes(total) == expected


def config(inputs, **kw) -> PrepareConfig:
    return PrepareConfig(inputs=[str(p) for p in inputs], output="unused", tokenizer=str(VOCAB), **kw)


@pytest.fixture(scope="module")
def ten_mb(tmp_path_factory):
    """WikiText-2 (the 1 MB sample) repeated to ~10 MB, sections kept apart by blank lines."""
    path = tmp_path_factory.mktemp("plan") / "ten.txt"
    text = WIKITEXT.read_bytes()
    with open(path, "wb") as f:
        for _ in range(10):
            f.write(text + b"\n\n")
    return path


def test_a_small_corpus_is_cut_in_several_tasks_by_default(ten_mb):
    plan = plan_tasks(config([ten_mb]))
    size = ten_mb.stat().st_size
    assert plan.split_bytes == 1 * MIB
    assert len(plan.tasks) == -(-size // MIB) >= 10  # so several workers share it
    assert sum(t.input_bytes for t in plan.tasks) == size
    # the task size, hence the plan, depends on the input only
    assert plan_tasks(config([ten_mb], workers=1)).fingerprint() == plan_tasks(config([ten_mb], workers=7)).fingerprint()


def test_a_set_split_size_wins_over_auto(ten_mb):
    plan = plan_tasks(config([ten_mb], split_bytes="4MB"))
    assert plan.split_bytes == 4 * MIB and len(plan.tasks) == 3
    assert plan_tasks(config([ten_mb], split_bytes="auto")).split_bytes == 1 * MIB


def test_small_files_are_grouped_up_to_the_auto_size():
    plan = plan_tasks(config([SAMPLE_TEXT, WIKITEXT, WIKIEXTRACTOR]))  # 4 KB, 0.95 MiB, 0.99 MiB
    assert plan.split_bytes == 1 * MIB
    assert [[p.url for p in t.pieces] for t in plan.tasks] == [[str(SAMPLE_TEXT), str(WIKITEXT)], [str(WIKIEXTRACTOR)]]
