"""The benchmark script still runs (a few seconds on a tiny input). Never asserts on speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO


def test_prepare_bench_smoke(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [
            sys.executable, str(REPO / "benchmarks" / "prepare_bench.py"),
            "--sizes", "64KB,96KB", "--repeats", "1", "--variants", "raw,tf-d1,pq-d1,tf-d1-w2,tf-d1-x2",
            "--plan-size", "8MB", "--no-warmup", "--json", str(out), "--workdir", str(tmp_path / "work"),
        ],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ratio vs raw" in proc.stdout
    assert "ratio pq-d1/tf-d1" in proc.stdout
    assert "planning 8MB" in proc.stdout
    result = json.loads(out.read_text())
    first = result["sizes"]["64KB"]
    assert set(first["variants"]) == {"raw", "tf-d1", "pq-d1", "tf-d1-w2", "tf-d1-x2"}
    # two one-worker runs on the halves of the input tokenize the same lines as one run on all of it
    (rnd,) = first["rounds"]
    assert rnd["tf-d1-x2"]["tokens"] == rnd["tf-d1"]["tokens"] > 0
    assert len(rnd["tf-d1-x2"]["seconds_each"]) == 2 and "ratio tf-d1-x2/tf-d1" in proc.stdout
    assert first["comparisons"]["tf-d1-w2/tf-d1"]["share_of_two_runs"] > 0
    for name in ("tf-d1", "pq-d1"):
        entry = first["variants"][name]
        assert entry["ratio_vs_raw"] > 0 and entry["mb_per_s"] > 0 and entry["peak_rss_mb"] > 0
    assert set(result["sizes"]["96KB"]["variants"]) == {"raw", "tf-d1", "tf-d1-w2", "tf-d1-x2"}
    assert result["rss_flatness"]["max_over_min"] >= 1
    assert result["planning"]["tasks"] >= 1
    assert result["machine"]["cpus"] >= 1


def test_workers_timeline_smoke(tmp_path):
    """One round of one and two workers on 2 MB: every task is on the timeline, the phases add up,
    the workers' CPU time and page faults are counted apart from the driver's."""
    out = tmp_path / "timeline.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "workers_timeline.py"), "--size", "2MB", "--tasks", "4",
         "--repeats", "1", "--out", str(out), "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--workers 2 / --workers 1:" in proc.stdout
    result = json.loads(out.read_text())
    assert set(result["runs"]) == {"1", "2"}
    for workers, (run,) in result["runs"].items():
        assert run["workers"] == int(workers) and run["tasks"] == 4 and len(run["spans"]) == 4
        parts = run["before_first_task"] + run["tasks_window"] + run["after_last_task"]
        assert abs(parts - run["total"]) < 0.005, run
        assert 0 < run["tokenizer load"] <= run["start_run"] <= run["before_first_task"]
        assert run["task_seconds"] > 0 and all(a < b for a, b in run["spans"])
    assert "pool start" in result["runs"]["2"][0] and "pool start" not in result["runs"]["1"][0]
    one, two = result["runs"]["1"][0], result["runs"]["2"][0]
    assert "workers faults" not in one and "load_average_end" in result
    # the pool's workers run the tasks, touching fresh memory of their own (page faults are exact
    # counts; CPU seconds are sampled, so only their presence is checked)
    assert two["workers faults"] > 1000 and two["workers user"] + two["workers system"] > 0


def test_scaling_smoke(tmp_path):
    """One and two workers on 4 MB beside one and two raw processes on 1 MB: every row there, the
    speed-ups relative to one worker."""
    out = tmp_path / "scaling.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "scaling.py"), "--size", "4MB", "--raw-size", "1MB",
         "--workers", "2", "--tasks", "4", "--repeats", "1", "--out", str(out), "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert [row["workers"] for row in result["rows"]] == [1, 2]
    one, two = result["rows"]
    assert one["prepare_speedup"] == one["raw_speedup"] == 1.0
    for row in (one, two):
        assert row["prepare_mb_per_s"] > 0 and row["raw_mb_per_s"] > 0
        assert abs(row["prepare_mb_per_s_per_core"] * row["workers"] - row["prepare_mb_per_s"]) < 0.05
    (prepare_two,) = result["runs"]["prepare-2"]
    assert prepare_two["tasks"] == 4
    (raw_two,) = result["runs"]["raw-2"]
    assert raw_two["tokens"] > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="measures Linux processes (fork)")
def test_page_costs_smoke(tmp_path):
    """Each cost is measured, and none is zero: faulting in a fresh page or a copied one, reaping a
    process, and the pages a process holds at its exit (32 MB of them take far longer to give back
    than 1 MB: the child must still hold them when it exits)."""
    out = tmp_path / "costs.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "page_costs.py"), "--mb", "32", "--repeats", "1",
         "--loops", "200000", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    medians = result["medians"]
    assert medians["fresh fault us/page"] > 0 and medians["copy-on-write fault us/page"] > 0
    assert medians["exit of a 1 MB process, ms"] > 0 and medians["exit us/page"] > 0
    if len(os.sched_getaffinity(0)) >= 2:
        assert len(result["loop_seconds_alone"]) == 2 and len(result["loop_seconds_together"]) == 2
        assert medians["two at once / alone, CPU-bound loop"] > 0


def test_zipf_text_has_the_sources_head_and_a_long_tail(tmp_path):
    """The long-tail text: at least the size asked, the source's most frequent word first, and far
    more distinct words than the source holds (the tail of made-up words)."""
    import collections

    out = tmp_path / "zipf.txt"
    source = REPO / "sample" / "wikitext2-train-1MB.txt"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "zipf_text.py"), "--source", str(source), "--size", "4MB",
         "--types", "500000", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = out.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) >= 4 << 20 and "\n\n" in text
    words = collections.Counter(text.split())
    head = collections.Counter(source.read_text(encoding="utf-8").split()).most_common(1)
    assert next(w for w, _ in words.most_common(3) if w != ".") == head[0][0]
    assert len(words) > 3 * len(set(source.read_text(encoding="utf-8").split()))


def test_prepare_bench_sop_variants_smoke(tmp_path):
    """ALBERT's objective in the benchmark: sop (default mode) and its reference run and are
    reported beside raw."""
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "prepare_bench.py"), "--sizes", "64KB", "--repeats", "1",
         "--variants", "raw,sop-d1,sop-ref-d1", "--no-warmup", "--json", str(out), "--workdir", str(tmp_path / "w")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    variants = json.loads(out.read_text())["sizes"]["64KB"]["variants"]
    assert set(variants) == {"raw", "sop-d1", "sop-ref-d1"}
    for name in ("sop-d1", "sop-ref-d1"):
        assert variants[name]["ratio_vs_raw"] > 0 and variants[name]["mb_per_s"] > 0


def test_prepare_bench_bpe_case_smoke(tmp_path, roberta_bpe):
    """The byte-level BPE case: raw HF, the fast backend (fastokens) and packed with RoBERTa's
    tokenizer, reported beside each other."""
    pytest.importorskip("fastokens")
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "prepare_bench.py"), "--sizes", "64KB", "--repeats", "1",
         "--variants", "raw,fast,packed", "--bpe-vocab", str(roberta_bpe), "--bpe-size", "64KB", "--no-warmup",
         "--startup-repeats", "0", "--plan-size", "0", "--json", str(out), "--workdir", str(tmp_path / "w")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "byte-level BPE tokenizer.json" in proc.stdout
    bpe = json.loads(out.read_text())["bpe"]
    assert set(bpe["variants"]) == {"raw", "fast", "packed"}
    (rnd,) = bpe["rounds"]
    assert rnd["fast"]["tokens"] == rnd["raw"]["tokens"] > 0  # the same ids, counted
    for name in ("fast", "packed"):
        assert bpe["variants"][name]["ratio_vs_raw"] > 0


def test_prepare_bench_held_out_whole_process_smoke(tmp_path):
    """``--held-out``: the whole-process figure (whole_process.py's measurement) on a held-out English
    text at tf-d1's and tf-d5's dupe factors and on a Chinese one, recorded and printed beside the
    in-process ratios."""
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "prepare_bench.py"), "--sizes", "64KB", "--repeats", "1",
         "--variants", "raw,tf-d1,tf-d5", "--no-warmup", "--plan-size", "0", "--startup-repeats", "0",
         "--held-out", str(REPO / "sample" / "wikiextractor-AA.txt"), "--held-out-rounds", "1",
         "--held-out-zh", str(REPO / "tests" / "data" / "hongloumeng-300KB.txt"),
         "--json", str(out), "--workdir", str(tmp_path / "w")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "whole process on held-out text" in proc.stdout
    result = json.loads(out.read_text())
    figures = result["held_out_whole_process"]
    assert set(figures) == {"english tf-d1", "english tf-d5", "chinese tf-d1"}
    assert figures["english tf-d5"]["settings"]["dupe_factor"] == 5
    assert figures["chinese tf-d1"]["settings"]["source"] == "hongloumeng-300KB.txt"
    for entry in figures.values():
        assert entry["ratio_cpu"] > 0 and entry["ratio_wall"] > 0 and entry["settings"]["bytes"] >= 64 << 10
        assert len(entry["runs"]["raw"]) == len(entry["runs"]["prepare"]) == 1
    inside = result["sizes"]["64KB"]["variants"]["tf-d5"]
    assert figures["english tf-d5"]["in_process"]["cpu_ratio_vs_raw"] == inside["cpu_ratio_vs_raw"]


def test_whole_process_times_both_hf_calls_as_baselines(tmp_path):
    """``whole_process.py`` times the raw script with ``encode_batch_fast`` (the ratios' baseline)
    and with ``encode_batch`` in the same alternating rounds, and reports both ratios; the two
    raw scripts tokenize the same text into the same number of tokens."""
    out = tmp_path / "whole.json"
    vocab = REPO / "tests" / "data" / "xlmr-unigram-32k-tokenizer.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "whole_process.py"), "--input",
         str(REPO / "sample" / "wikiextractor-AA.txt"), "--vocab", str(vocab), "--size", "64KB", "--rounds", "1",
         "--objective", "packed", "--json", str(out), "--workdir", str(tmp_path / "w")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(encode_batch_fast) / prepare" in proc.stdout and "(encode_batch) / prepare" in proc.stdout
    result = json.loads(out.read_text())
    assert set(result["runs"]) == {"raw", "raw_encode_batch", "prepare"}
    assert result["settings"]["baselines"] == ["encode_batch_fast", "encode_batch"]
    for key in ("ratio_cpu", "ratio_wall", "ratio_cpu_encode_batch", "ratio_wall_encode_batch"):
        assert result[key] > 0
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import whole_process
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    for tokenizer in (vocab, REPO / "sample" / "bert-base-uncased-vocab.txt"):  # (WordPiece: through HF's wrapper)
        counts = [subprocess.run([sys.executable, "-c", whole_process.RAW_SCRIPT,
                                  str(REPO / "sample" / "wikiextractor-AA.txt"), str(tokenizer), "1000", method],
                                 capture_output=True, text=True, check=True).stdout
                  for method in ("encode_batch_fast", "encode_batch")]
        assert counts[0] == counts[1] and int(counts[0]) > 10_000
    with pytest.raises(ValueError, match="encode_batch_fast first"):
        whole_process.run(REPO / "sample" / "wikiextractor-AA.txt", vocab, 1, baselines=("encode_batch",))
