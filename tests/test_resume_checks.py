"""What a rerun into an existing output compares: every difference listed at once, the
tokenizer by its content (not where its file lies)."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import SAMPLE_TEXT, VOCAB, WIKITEXT
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.errors import OutputError
from mlm_pipeline.pipeline import run_prepare


def config(out, inputs, vocab=VOCAB, **kw) -> PrepareConfig:
    return PrepareConfig(inputs=[str(p) for p in inputs], output=str(out), tokenizer=str(vocab), workers=1,
                         progress=False, **kw)


def test_refusal_lists_changed_settings_and_changed_inputs(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    shutil.copy(SAMPLE_TEXT, a)
    shutil.copy(SAMPLE_TEXT, b)
    out = tmp_path / "out"
    run_prepare(config(out, [a, b]))
    with a.open("a") as f:
        f.write("One more sentence.\n")
    b.unlink()
    c = tmp_path / "c.txt"
    shutil.copy(SAMPLE_TEXT, c)
    with pytest.raises(OutputError) as refused:
        run_prepare(config(out, [a, c], dupe_factor=2, masked_lm_prob=0.2))
    message = str(refused.value)
    assert "dupe-factor: 1 in the existing run, 2 now" in message
    assert "masked-lm-prob: 0.15 in the existing run, 0.2 now" in message
    size = SAMPLE_TEXT.stat().st_size
    assert (f"the input files changed since the existing run started: new {c}; gone {b}; "
            f"resized {a} ({size:,} -> {size + 19:,} bytes)") in message
    # settings that only cut the same files otherwise are not reported as changed inputs
    shutil.copy(SAMPLE_TEXT, a)
    shutil.copy(SAMPLE_TEXT, b)
    with pytest.raises(OutputError) as refused:
        run_prepare(config(out, [a, b], split_bytes="4KiB"))
    assert "split-size: auto in the existing run, 4096 now" in str(refused.value)
    assert "input files changed" not in str(refused.value)


def test_the_same_vocab_elsewhere_resumes_another_is_refused(tmp_path):
    out = tmp_path / "out"
    first = run_prepare(config(out, [SAMPLE_TEXT, WIKITEXT], split_bytes="256KB"))
    assert first["tasks"] > 1
    moved = tmp_path / "elsewhere" / "vocab.txt"
    moved.parent.mkdir()
    shutil.copy(VOCAB, moved)
    marker = next((out / "_tasks").iterdir())
    marker.unlink()  # one task to redo after the move
    again = run_prepare(config(out, [SAMPLE_TEXT, WIKITEXT], vocab=moved, split_bytes="256KB"))
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in first["shards"]]
    assert again["output_fingerprint"] == first["output_fingerprint"]
    assert again["config"]["tokenizer"] == str(moved)  # recorded where it is now
    # a vocab with one entry changed is another tokenizer, whatever its file is called
    other = tmp_path / "other" / "vocab.txt"
    other.parent.mkdir()
    lines = VOCAB.read_text(encoding="utf-8").splitlines()
    other.write_text("\n".join(lines[:-1] + ["zzzz"]) + "\n", encoding="utf-8")
    with pytest.raises(OutputError, match="the tokenizer differs from the one the existing run used"):
        run_prepare(config(out, [SAMPLE_TEXT, WIKITEXT], vocab=other, split_bytes="256KB"))
    record = json.loads((out / "_run.json").read_text())
    assert record["settings"]["tokenizer"] == str(VOCAB)  # the run record keeps where it started


def test_a_stale_marker_is_deleted_only_as_it_was_read(tmp_path):
    """Claim and array workers start while others run: a marker found stale is read again before it
    is deleted, and one another worker rewrote since (its task redone) is kept; of an array
    worker, only the markers of its own share are deleted."""
    from mlm_pipeline.plan import plan_tasks
    from mlm_pipeline.run import layout
    from mlm_pipeline.run.state import completed_tasks, forget_rejected

    out = tmp_path / "out"
    run = config(out, [SAMPLE_TEXT, WIKITEXT], split_bytes="256KB")
    run_prepare(run)
    plan = plan_tasks(run)
    first, second, third = (plan.tasks[i].task_id for i in range(3))
    for task_id in (first, second, third):
        marker = out / layout.TASKS_DIR / f"{task_id}.json"
        marker.write_text(marker.read_text().replace('"output_fingerprint":"', '"output_fingerprint":"x'))
    done = completed_tasks(run, plan)
    assert set(done.rejected) == {first, second, third}
    rewritten = out / layout.TASKS_DIR / f"{second}.json"
    rewritten.write_text(rewritten.read_text().replace('"output_fingerprint":"x', '"output_fingerprint":"'))
    forget_rejected(str(out), done, task_ids=[first, second])
    assert not (out / layout.TASKS_DIR / f"{first}.json").exists()  # stale, as read: deleted
    assert rewritten.exists()  # redone by another worker since: kept
    assert (out / layout.TASKS_DIR / f"{third}.json").exists()  # another worker's share: kept


def test_a_finished_run_without_its_markers_is_not_replaced(tmp_path):
    """An output copied without _tasks/: its manifest says it read documents, so a command with
    other settings is refused, not taken as a run that completed nothing."""
    out = tmp_path / "out"
    run_prepare(config(out, [SAMPLE_TEXT]))
    shutil.rmtree(out / "_tasks")
    with pytest.raises(OutputError, match="already holds a run with other settings"):
        run_prepare(config(out, [SAMPLE_TEXT], max_seq_length=64))
    assert list((out / "shards").iterdir())


def test_an_unfinished_run_whose_markers_cannot_be_read_is_not_replaced(tmp_path):
    """A run stopped before its manifest, rerun with another setting while its markers cannot be
    read (a storage error: here each marker's path is a directory): nothing tells that it read
    nothing, so it is kept and the change refused, not replaced with its shards deleted."""
    out = tmp_path / "out"
    run_prepare(config(out, [SAMPLE_TEXT], split_bytes="2KB"))
    (out / "manifest.json").unlink()
    shards = sorted(p.name for p in (out / "shards").iterdir())
    markers = sorted((out / "_tasks").glob("*.json"))
    assert len(markers) > 1
    for marker in markers:
        marker.rename(marker.with_suffix(".saved"))
        marker.mkdir()
    with pytest.raises(OutputError, match="max-seq-length: 128 in the existing run, 64 now"):
        run_prepare(config(out, [SAMPLE_TEXT], split_bytes="2KB", max_seq_length=64))
    assert sorted(p.name for p in (out / "shards").iterdir()) == shards
    assert json.loads((out / "_run.json").read_text())["settings"]["max_seq_length"] == 128


def test_an_output_with_shards_but_no_run_record_is_refused(tmp_path):
    """Another run's shards (its _run.json and markers removed) or a user's own files under a
    run's names: a new run would write beside them, and a glob over shards/ would read them."""
    out = tmp_path / "out"
    run_prepare(config(out, [SAMPLE_TEXT], split_bytes="2KB"))
    for name in ("_run.json", "_plan.json"):
        (out / name).unlink()
    shutil.rmtree(out / "_tasks")
    shards = sorted(p.name for p in (out / "shards").iterdir())
    with pytest.raises(OutputError, match=rf"holds {len(shards)} file\(s\) in shards/ and manifest.json but no "
                                          r"_run.json"):
        run_prepare(config(out, [WIKITEXT]))
    assert sorted(p.name for p in (out / "shards").iterdir()) == shards
    mine = tmp_path / "mine"
    (mine / "shards").mkdir(parents=True)
    (mine / "shards" / "important.tfrecord").write_bytes(b"not ours")
    with pytest.raises(OutputError, match=r"holds 1 file\(s\) in shards/ but no _run.json"):
        run_prepare(config(mine, [SAMPLE_TEXT]))
    assert (mine / "shards" / "important.tfrecord").read_bytes() == b"not ours"
    assert not (mine / "_run.json").exists()



@pytest.mark.parametrize("whole_words", [False, True])
def test_a_run_recorded_before_the_masking_schemes_resumes(tmp_path, whole_words):
    """A run record written before the masking-scheme settings existed (no masking_scheme, ngram,
    span_... in its settings) is read as that version behaved: --do-whole-word-mask was the
    whole-word scheme, and every new setting's default the earlier behaviour. The same command
    resumes it (it was refused for six settings 'None in the existing run'); another scheme is
    still refused."""
    from mlm_pipeline.config import MASKING_PARAMETERS

    out = tmp_path / "out"
    first = run_prepare(config(out, [SAMPLE_TEXT], do_whole_word_mask=whole_words))
    record = json.loads((out / "_run.json").read_text())
    for key in ("masking_scheme", *MASKING_PARAMETERS):
        del record["settings"][key]
    (out / "_run.json").write_text(json.dumps(record))
    (out / "manifest.json").unlink()
    again = run_prepare(config(out, [SAMPLE_TEXT], do_whole_word_mask=whole_words))
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in first["shards"]]
    with pytest.raises(OutputError, match="masking-scheme: 'whole-word' in the existing run, 'span' now"
                       if whole_words else "masking-scheme: 'token' in the existing run, 'span' now"):
        run_prepare(config(out, [SAMPLE_TEXT], masking_scheme="span"))
