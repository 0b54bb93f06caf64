"""Tokenizer backends: ``auto`` takes the fast one, output never depends on it, and any
difference from HF — at load (the probe set) or in a task's own text — falls back to HF with a
warning and a manifest entry."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import SAMPLE_TEXT, VOCAB
from mlm_pipeline.errors import ConfigError
from mlm_pipeline.tokenize import TextTokenizer, load_tokenizer
from mlm_pipeline.tokenize.backends.nanotoken import NanotokenEncoder
from mlm_pipeline.tokenize.selfcheck import PROBES
from test_shard_digests import CASES, DIGESTS, case_id, run_case


def test_auto_takes_the_fast_backend_and_records_it():
    tok = TextTokenizer(str(VOCAB))
    assert tok.backend_info == {"backend": "nanotoken", "version": NanotokenEncoder.version(), "requested": "auto"}


def test_probe_set_covers_the_hard_cases():
    text = "".join(PROBES)
    for needle in ("\x00", "\r\n", "\u200b", "\u0301", "\U0001f3fd", "\u0627", "\u0928", "\u0e2a", "\u30ab",
                   "\ud55c", "\uff21", "\ufffd", "a" * 101, "a" * 250, "!!!???"):
        assert needle in text
    assert "" in PROBES and " " in PROBES


def test_unknown_backend_is_refused():
    with pytest.raises(ConfigError, match="unknown tokenizer backend 'fast'"):
        TextTokenizer(str(VOCAB), backend="fast")


class _OffByOne(NanotokenEncoder):
    """A fast backend that is wrong on texts containing ``trigger``."""

    trigger = "\u00e9"

    def encode_batch(self, texts):
        ids, lens = super().encode_batch(texts)
        bad = np.repeat(np.array([self.trigger in t for t in texts]), lens)
        return np.where(bad, ids + 1, ids).astype(np.int32), lens


def test_a_backend_failing_the_probe_set_falls_back_at_load(monkeypatch, caplog):
    from mlm_pipeline.tokenize import backends

    monkeypatch.setitem(backends.BACKENDS, "nanotoken", _OffByOne)
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        tok = TextTokenizer(str(VOCAB))
    assert tok.encoder.name == "hf"
    assert "self-check" in tok.backend_info["fallback_reason"]
    assert "falls back to hf" in caplog.text


def test_a_backend_differing_on_real_input_falls_back_for_the_task(monkeypatch, tmp_path, caplog):
    """The probe set passes (the trigger is in no probe), the task's own first block does not:
    the run warns, names the text, records the fallback, and writes the same bytes as HF."""
    from mlm_pipeline.tokenize import backends

    class Rare(_OffByOne):
        trigger = "season"  # in the WikiText sample's first line, in no probe

    assert not any(Rare.trigger in p for p in PROBES)
    monkeypatch.setitem(backends.BACKENDS, "nanotoken", Rare)
    load_tokenizer.cache_clear()  # the run must load the patched backend, in this process
    request_cleanup = load_tokenizer.cache_clear
    case = CASES[0]
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        got, manifest = run_case(case, tmp_path / "out", 1, with_manifest=True)
    assert got == json.loads(DIGESTS.read_text())[case_id(case)]
    assert "ids differ from HF on text" in caplog.text and "season" in caplog.text
    request_cleanup()
    fallbacks = [b for b in manifest["tokenizer_backend"] if b.get("fallback_from") == "nanotoken"]
    assert fallbacks and fallbacks[0]["backend"] == "hf" and "season" in fallbacks[0]["fallback_reason"]


def _two_tasks_one_difference(monkeypatch, tmp_path):
    """A fast backend wrong on "zyzzyva", which is in the first line of task 00000's file and, in
    task 00001's, only past what that task's check reads; and a run of the two files."""
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.pipeline import run_prepare
    from mlm_pipeline.tokenize import backends

    class Rare(_OffByOne):
        trigger = "zyzzyva"

    monkeypatch.setitem(backends.BACKENDS, "nanotoken", Rare)
    text = SAMPLE_TEXT.read_text(encoding="utf-8")
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("The zyzzyva is a weevil.\n" + text * 4, encoding="utf-8")
    b.write_text(text * 3 + "\nA zyzzyva came late.\n", encoding="utf-8")

    def run(out, **kw):
        load_tokenizer.cache_clear()  # a fresh process's tokenizer
        try:
            run_prepare(PrepareConfig(inputs=[str(a), str(b)], output=str(out), tokenizer=str(VOCAB), workers=1,
                                      progress=False, split_bytes="20KB", **kw))
        finally:
            load_tokenizer.cache_clear()
        markers = {p.stem: json.loads(p.read_text())["tokenizer_backend"] for p in (out / "_tasks").glob("*.json")}
        return {p.name: p.read_bytes() for p in (out / "shards").iterdir()}, markers

    return run


def test_a_tasks_fallback_holds_for_that_task_only(monkeypatch, tmp_path):
    """Array workers: task 00001 is encoded by the fast backend whether task 00000, which fell
    back, ran before it in the same process (one worker owning both) or not (a worker running it
    alone): its shard is the same bytes either way, and each marker records its task's backend."""
    run = _two_tasks_one_difference(monkeypatch, tmp_path)
    both, markers = run(tmp_path / "both", task_count=1, task_rank=0)
    alone, _ = run(tmp_path / "alone", task_count=2, task_rank=1)
    assert sorted(both) == ["part-00000-00000.tfrecord", "part-00001-00000.tfrecord"]
    assert list(alone) == ["part-00001-00000.tfrecord"]
    assert both["part-00001-00000.tfrecord"] == alone["part-00001-00000.tfrecord"]
    assert markers["00000"]["fallback_from"] == "nanotoken" and markers["00000"]["backend"] == "hf"
    assert markers["00001"]["backend"] == "nanotoken"
    # the plain command over that complete output leaves it as it is (nothing runs, nothing is redone)
    manifest = (tmp_path / "both" / "manifest.json").read_bytes()
    again, _ = run(tmp_path / "both")
    assert again == both and (tmp_path / "both" / "manifest.json").read_bytes() == manifest


def test_after_a_fallback_one_backend_encodes_the_whole_run(monkeypatch, tmp_path, caplog):
    """A plain run: task 00000's fallback makes the run encode task 00001 again with HF, so the
    shards are those of --tokenizer-backend hf, the difference past 00001's check included."""
    run = _two_tasks_one_difference(monkeypatch, tmp_path)
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        got, markers = run(tmp_path / "auto")
    assert "task 00000 showed a difference from HF on its own text; the 1 task(s) the fast backend encoded are " \
           "run again with hf" in caplog.text
    want, _ = run(tmp_path / "hf", tokenizer_backend="hf")
    assert got == want
    assert {m["backend"] for m in markers.values()} == {"hf"}
    manifest = json.loads((tmp_path / "auto" / "manifest.json").read_text())
    assert sum(b["tasks"] for b in manifest["tokenizer_backend"]) == 2
    assert all(b["backend"] == "hf" for b in manifest["tokenizer_backend"])


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_hf_backend_writes_the_same_bytes(case, tmp_path):
    """Byte-identical shards with ``--tokenizer-backend hf`` and with the default (the digests)."""
    got, manifest = run_case(case, tmp_path / "out", 1, with_manifest=True, tokenizer_backend="hf")
    assert {b["backend"] for b in manifest["tokenizer_backend"]} == {"hf"}
    assert got == json.loads(DIGESTS.read_text())[case_id(case)]


def test_reference_mode_encodes_with_the_checked_fast_backend_and_falls_back_on_a_difference(
        monkeypatch, tmp_path, caplog):
    """Reference mode tokenizes by Google's rules (no added-token matching, 200-character
    words) with its own encoder: the fast backend when it passes the same checks, recorded in
    the manifest; a difference on the file's own text falls back to HF with the same bytes."""
    from mlm_pipeline.instances import reference_text
    from mlm_pipeline.tokenize import backends

    case = next(c for c in CASES if c["reference"] and c["format"] == "tfrecord" and not c["do_whole_word_mask"])
    expected = json.loads(DIGESTS.read_text())[case_id(case)]
    load_tokenizer.cache_clear()
    reference_text._reference_tokenizer.cache_clear()
    got, manifest = run_case(case, tmp_path / "fast", 1, with_manifest=True)
    assert got == expected
    assert {b["backend"] for b in manifest["tokenizer_backend"]} == {"nanotoken"}

    class Rare(_OffByOne):
        trigger = "season"  # in the first lines of the sample, in no probe

    monkeypatch.setitem(backends.BACKENDS, "nanotoken", Rare)
    load_tokenizer.cache_clear()
    reference_text._reference_tokenizer.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
            got, manifest = run_case(case, tmp_path / "fallback", 1, with_manifest=True)
    finally:
        load_tokenizer.cache_clear()
        reference_text._reference_tokenizer.cache_clear()
    assert got == expected
    assert "ids differ from HF on text" in caplog.text and "season" in caplog.text
    fallbacks = [b for b in manifest["tokenizer_backend"] if b.get("fallback_from") == "nanotoken"]
    assert fallbacks and fallbacks[0]["backend"] == "hf" and "season" in fallbacks[0]["fallback_reason"]


def test_the_per_task_check_takes_non_ascii_texts_first_within_a_budget_proportional_to_the_task():
    from mlm_pipeline.tokenize.selfcheck import CHECK_MAX_BYTES, CHECK_MIN_BYTES, check_budget, first_texts

    assert check_budget(1 << 20) == CHECK_MIN_BYTES            # small tasks: the floor
    assert check_budget(8 << 20) == (8 << 20) // 512           # 16 KB of an 8 MB task
    assert check_budget(1 << 40) == CHECK_MAX_BYTES            # the cap
    docs = [["plain " * 20, "caf\u00e9 " * 5], ["more plain " * 10, "\u4e2d\u6587" * 3, "x" * 50]]
    assert first_texts(docs, budget=40) == ["caf\u00e9 " * 5, "\u4e2d\u6587" * 3, "plain " * 20]
    assert first_texts(docs, budget=10) == ["caf\u00e9 " * 5]
    assert first_texts(docs, budget=10_000) == ["caf\u00e9 " * 5, "\u4e2d\u6587" * 3, "plain " * 20,
                                                "more plain " * 10, "x" * 50]
    # a long line is cut (a whole 16 MB line took HF 2 GB; both encoders see the same characters)
    long_line = "word " * 1_000_000
    assert first_texts([[long_line]]) == [long_line[:CHECK_MAX_BYTES]]


_CACHE_PROBE = """
import json, os, random, sys
from mlm_pipeline.tokenize import TextTokenizer
import nanotoken

def resident_kb():  # what the process holds now (the caches stay held), not its peak so far
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

tok = TextTokenizer(sys.argv[1])
assert tok.encoder.name == "nanotoken"
rng = random.Random(3)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(8, 12))) for _ in range(1_200_000)]
lines = [" ".join(words[i:i + 20]) for i in range(0, len(words), 20)]
before = resident_kb()
for i in range(0, len(lines), 2000):
    tok.encode_batch(lines[i:i + 2000])
grown = resident_kb() - before
print(json.dumps({"entries": nanotoken.get_cache_entries(), "grown_kb": grown}))
"""


def _in_fresh_process(code: str, env_entries: str | None = None) -> str:
    """The last line ``code`` prints, run in a new interpreter (nanotoken's cache size is the
    process's) with ``NANOTOKEN_CACHE_ENTRIES`` set to ``env_entries`` or unset."""
    env = {k: v for k, v in os.environ.items() if k != "NANOTOKEN_CACHE_ENTRIES"}
    if env_entries is not None:
        env["NANOTOKEN_CACHE_ENTRIES"] = env_entries
    proc = subprocess.run([sys.executable, "-c", code, str(VOCAB)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def _cache_probe(env_entries: str | None) -> dict:
    return json.loads(_in_fresh_process(_CACHE_PROBE, env_entries))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_the_fast_backend_caps_its_word_cache_unless_the_environment_sets_it():
    """1.2 million distinct words (a long tail no cache can hold): with the cap the process grows
    by a fraction of what nanotoken's default size (2**20 entries per table), set in the
    environment, makes it grow."""
    from mlm_pipeline.tokenize.backends.nanotoken import CACHE_ENTRIES

    capped, uncapped = _cache_probe(None), _cache_probe(str(1 << 20))
    assert capped["entries"] == CACHE_ENTRIES < 1 << 20 and uncapped["entries"] == 1 << 20
    assert uncapped["grown_kb"] > 100_000 and capped["grown_kb"] < 0.7 * uncapped["grown_kb"], (capped, uncapped)


def test_a_cache_size_the_program_chose_is_kept():
    """A program that set nanotoken's cache size itself before loading a tokenizer through the
    pipeline keeps it."""
    code = ("import nanotoken, sys; nanotoken.set_cache_entries(1 << 15); "
            "from mlm_pipeline.tokenize import TextTokenizer; tok = TextTokenizer(sys.argv[1]); "
            "assert tok.encoder.name == 'nanotoken'; print(nanotoken.get_cache_entries())")
    assert int(_in_fresh_process(code)) == 1 << 15


def test_chinese_texts_take_the_character_table_and_give_hf_s_ids():
    """Mostly-CJK texts go through the table of isolated characters, the runs between them
    through nanotoken, and mixed batches keep their order; the ids are HF's exactly, on the
    novel, on English beside it, and on the edges of the split (added tokens and accents next to
    ideographs, punctuation newer than HF's Unicode tables, astral ideographs, empty texts)."""
    from conftest import DATA, WIKITEXT
    from mlm_pipeline.tokenize.backends.hf import HFEncoder

    chinese = [s.strip() for s in (DATA / "hongloumeng-300KB.txt").read_text(encoding="utf-8").splitlines() if s.strip()]
    english = [s.strip() for s in WIKITEXT.read_text(encoding="utf-8").splitlines()[:3000] if s.strip()]
    edges = ["中[MASK]文", "中[mask]文[SEP]", "[CLS]中", "a中b", "ΣΑΣ中", "中\u0301x", "中\u0301", "\u037e中;",
             "中\u061d文\u2e43", "\U00020000中\U0002a6d6", "中\x00文\ufffd", "", "中", "  中  ", "中 文", "Ａ中ｂ",
             "caf\u00e9中", "中\u3000文。", "１２３中４５６", "中" * 300, "中文" + "x" * 150]
    texts = [t for pair in zip(chinese, english) for t in pair] + chinese[len(english):] + edges + list(PROBES)
    tok = load_tokenizer(str(VOCAB), backend="nanotoken")
    fast = NanotokenEncoder(tok.tokenizer)
    assert fast._table is not None
    reference = HFEncoder(tok.tokenizer, ascii_route=False)
    for batch in (texts, chinese, edges, english[:100]):
        ids, lengths = fast.encode_batch(batch)
        ref_ids, ref_lengths = reference.encode_batch(batch)
        np.testing.assert_array_equal(lengths, ref_lengths)
        np.testing.assert_array_equal(ids, ref_ids)
    # the novel's characters were looked up in the table, not encoded one line at a time
    assert (fast._table.ids[[ord(c) for c in "贾宝玉林黛玉，。"]] >= 0).all()
    assert fast._table.ids[ord("[")] == -1 and fast._table.ids[0x61D] == -1  # in [MASK]; newer than HF's tables


def test_only_texts_mostly_of_table_characters_take_the_table():
    """The routing of non-ASCII texts: every text with at least a quarter table characters (by the
    table's own lookup of every character) goes to the table; English with a few accented words
    is encoded whole, with its ASCII neighbours, from a bound on its UTF-8 bytes. Ids stay HF's on
    the mixed batch."""
    from conftest import DATA, WIKITEXT
    from mlm_pipeline.tokenize.backends.hf import HFEncoder
    from mlm_pipeline.tokenize.backends.single_chars import MIN_SHARE

    chinese = [s.strip() for s in (DATA / "hongloumeng-300KB.txt").read_text(encoding="utf-8").splitlines()[:200]
               if s.strip()]
    english = [s.strip() for s in WIKITEXT.read_text(encoding="utf-8").splitlines() if s.strip()]
    accented = [s for s in english if not s.isascii()][:300]
    assert len(accented) > 50
    edges = ["café, “quoted” — dash", "a café near Zürich, by the lake", "中文 and English words here", "a中b", "中" + "x" * 3, "中" + "x" * 2,
             "—!?", "Ａ中ｂ", "naïve", "\U00020000 ab", "ΣΑΣ", "x" * 7 + "。,", "x" * 6 + "。,", "é" * 4]
    texts = accented + chinese + edges
    tok = load_tokenizer(str(VOCAB), backend="nanotoken")
    fast = NanotokenEncoder(tok.tokenizer)
    table = fast._table
    may = table.may_take(texts)
    heavy = np.array([int((table._lookup(np.array([ord(c) for c in t], np.uint32)) >= 0).sum()) >= MIN_SHARE * len(t)
                      for t in texts])
    assert may[heavy].all()  # never a text the table takes
    assert heavy[len(accented): len(accented) + len(chinese)].all()
    # most accented English is encoded whole at once (a WikiText heading, `` = = Ötzi = = ``, is
    # mostly punctuation: the table's)
    assert may[: len(accented)].mean() < 0.2 and not may[[texts.index("a café near Zürich, by the lake"), texts.index("naïve")]].any()
    mixed = [t for pair in zip(english, texts) for t in pair]
    ids, lengths = fast.encode_batch(mixed)
    ref_ids, ref_lengths = HFEncoder(tok.tokenizer, ascii_route=False).encode_batch(mixed)
    np.testing.assert_array_equal(lengths, ref_lengths)
    np.testing.assert_array_equal(ids, ref_ids)
