"""A full disk under the output: the run fails with a clear message and leaves no partial shard;
once space is freed, the same command completes to the clean bytes.

The disk is a size-limited tmpfs mounted for the test, which needs root (CAP_SYS_ADMIN); where
the machine does not allow it, this case alone is skipped, saying why.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from faults.helpers import assert_as_clean, leftovers, prepare_args

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(mount)], check=True,
                       capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        pytest.skip(f"cannot mount a size-limited tmpfs here (needs root with CAP_SYS_ADMIN): {detail}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_fails_cleanly_and_the_rerun_completes(corpus, clean_run, small_disk, tally):
    clean = clean_run("parquet")
    assert sum(s["bytes"] for s in clean["shards"]) > 1_500_000  # more than the disk holds
    out = small_disk / "out"
    cmd = [sys.executable, "-m", "mlm_pipeline.cli", "prepare", *prepare_args(corpus, out)]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert first.returncode == 1, first.stderr
    # naming the file being written (the shard's temporary file); the error alone named none
    assert re.search(r"No space left on device: '[^']*/out/_tmp/[^']+\.partial'", first.stderr), first.stderr
    assert "Traceback" not in first.stderr
    assert "fix the cause and run the same command again" in first.stderr
    assert not (out / "manifest.json").exists()
    # no shard is partial: each one a marker lists is whole, and no other shard name exists
    assert [p for p in leftovers(out) if not p.startswith("_tmp/")] == []

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert_as_clean(out, clean)
    tally.record("full disk, then space freed")


def test_vocab_on_a_full_disk_writes_no_file_half_and_the_rerun_completes(small_disk, tmp_path, tally):
    """``vocab`` with room for ``tokenizer.json`` and two pages more: the disk fills while
    ``vocab.txt`` is written. It left a whole ``tokenizer.json`` beside a ``vocab.txt`` cut short,
    which ``prepare -t`` then used; now no file is under its final name (nor a temporary one),
    and once space is freed the same command writes both, as on a roomy disk."""
    from faults.helpers import SAMPLE

    text = (SAMPLE / "wikitext2-train-1MB.txt").read_bytes()
    corpus = tmp_path / "wikitext-200KB.txt"
    corpus.write_bytes(text[:text.index(b"\n", 200_000) + 1])
    cmd = [sys.executable, "-m", "mlm_pipeline.cli", "vocab", str(corpus), "--vocab-size", "3000"]
    clean = subprocess.run([*cmd, "-o", str(tmp_path / "clean")], capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr
    pages = -(-(tmp_path / "clean" / "tokenizer.json").stat().st_size // 4096)
    assert (tmp_path / "clean" / "vocab.txt").stat().st_size > 3 * 4096  # more than the room left for it
    subprocess.run(["mount", "-o", f"remount,size={4 * (pages + 2)}k", str(small_disk)], check=True)
    out = small_disk / "tok"
    first = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert first.returncode == 2, first.stderr
    assert "No space left on device" in first.stderr and "Traceback" not in first.stderr
    assert sorted(p.name for p in out.iterdir()) == []  # nothing half written, no temporary file

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    second = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    for name in ("tokenizer.json", "vocab.txt"):
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes()
    tally.record("vocab on a full disk, then space freed")


def test_a_run_file_that_does_not_fit_is_named(small_disk):
    """Markers, ``_plan.json``, ``_run.json`` and the manifest are written by one function: a full
    disk there names the file too, and leaves no temporary file."""
    from mlm_pipeline import fs

    with open(small_disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"x" * 65536)
                f.flush()
        except OSError:
            pass
    with pytest.raises(OSError, match=rf"No space left on device: '{re.escape(str(small_disk))}/_tasks/00003.json'"):
        fs.atomic_write_bytes(str(small_disk / "_tasks" / "00003.json"), b"{}" * 10_000)
    assert list((small_disk / "_tasks").iterdir()) == []
