"""The fast byte-level BPE backend (fastokens) on a RoBERTa-style tokenizer (GPT-2's merges, RoBERTa's
ids, ``<mask>`` with ``lstrip``): ``auto`` takes it, it gives HF's ids, the probes of its model type
catch a backend built wrongly, any difference falls back to HF with a warning and a manifest entry,
and the shards are the same bytes as with ``--tokenizer-backend hf``."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from conftest import DATA, SAMPLE_TEXT, WIKIEXTRACTOR, WIKITEXT
from mlm_pipeline.tokenize import TextTokenizer, load_tokenizer
from mlm_pipeline.tokenize.backends.fastokens import FastokensEncoder
from mlm_pipeline.tokenize.backends.hf import HFEncoder
from mlm_pipeline.tokenize.selfcheck import PROBE_SETS, PROBES, first_difference, probes_for

fastokens = pytest.importorskip("fastokens")

NEW_PROBES = (" \x85\x0b", "<id>666</id>", "\x85next line\x85", "\u094e \u0488", " <unk> ")
# every bundled corpus: plain text, WikiExtractor, Chinese, and the Wikipedia dumps (English, its
# multistream copies, tables, Bulgarian in UTF-16)
CORPORA = [WIKITEXT, SAMPLE_TEXT, WIKIEXTRACTOR, DATA / "hongloumeng-300KB.txt",
           *sorted(p for p in (DATA / "wiki").glob("*.bz2") if "-index" not in p.name)]


def _lines(path, limit=None) -> list[str]:
    lines = [s.strip() for s in path.read_text(encoding="utf-8").splitlines() if s.strip()]
    return lines[:limit]


def _variant(path, tmp_path, name, change) -> str:
    """A copy of the tokenizer.json at ``path`` with ``change`` applied to its JSON."""
    spec = json.loads(path.read_text(encoding="utf-8"))
    change(spec)
    out = tmp_path / f"{name}.json"
    out.write_text(json.dumps(spec), encoding="utf-8")
    return str(out)


def test_the_five_new_probes_are_checked_for_every_model_type():
    for model_type in ("wordpiece", "sentencepiece", "byte-level-bpe", "bpe", None):
        assert set(NEW_PROBES) <= set(probes_for(model_type))
        assert probes_for(model_type)[:len(PROBES)] == PROBES
    assert probes_for("wordpiece") == PROBES
    bpe = PROBE_SETS["byte-level-bpe"]
    assert probes_for("byte-level-bpe") == PROBES + bpe
    for needle in ("\x85", "a  b", " <mask>", "x<mask>y", "foo<s>bar", " Hello", "666", "cafe\u0301"):
        assert any(needle in p for p in bpe), needle


@pytest.mark.parametrize("add_prefix_space", [False, True])
def test_auto_takes_fastokens_for_a_byte_level_bpe_and_it_gives_hfs_ids(roberta_bpe, tmp_path, add_prefix_space):
    """With add_prefix_space off (RoBERTa's) and on, on real text of every kind and the probes."""
    path = _variant(roberta_bpe, tmp_path, f"aps-{add_prefix_space}",
                    lambda s: s["pre_tokenizer"].update(add_prefix_space=add_prefix_space))
    tok = TextTokenizer(path)
    assert tok.model_type == "byte-level-bpe" and tok.word_marker == ("start", "\u0120")
    assert tok.backend_info == {"backend": "fastokens", "version": FastokensEncoder.version(), "requested": "auto"}
    texts = list(probes_for("byte-level-bpe")) + _lines(WIKITEXT, 3000) + _lines(WIKIEXTRACTOR, 500) \
        + _lines(DATA / "hongloumeng-300KB.txt", 200)
    ids, lens = tok.encoder.encode_batch(texts)
    want_ids, want_lens = HFEncoder(tok.tokenizer, ascii_route=False).encode_batch(texts)
    assert np.array_equal(lens, want_lens) and np.array_equal(ids, want_ids)
    # the same text gives other ids with and without the prefix space: the probes tell them apart
    hello = tok.encoder.encode_batch(["Hello"])[0].tolist()
    assert (tok.convert_ids_to_tokens(hello) == ["\u0120Hello"]) == add_prefix_space


def test_fastokens_runs_on_the_calling_thread(roberta_bpe):
    """No thread pool of its own: the pipeline's parallelism is its processes (one core each)."""
    import os
    import subprocess
    import sys

    code = ("import os, sys\n"
            "from mlm_pipeline.tokenize import TextTokenizer\n"
            "tok = TextTokenizer(sys.argv[1]); assert tok.encoder.name == 'fastokens'\n"
            "tok.encode_batch(['some text to encode'] * 20000)\n"
            "print(sorted(open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task')))")
    env = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"}
    done = subprocess.run([sys.executable, "-c", code, str(roberta_bpe)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert not any(name.startswith("fastokens") for name in eval(done.stdout.strip().splitlines()[-1]))


def _no_mask_lstrip(spec):
    for t in spec["added_tokens"]:
        if t["content"] == "<mask>":
            t["lstrip"] = False


def _flip_prefix_space(spec):
    spec["pre_tokenizer"]["add_prefix_space"] = not spec["pre_tokenizer"]["add_prefix_space"]


def _no_split_regex(spec):
    spec["pre_tokenizer"]["use_regex"] = False


@pytest.mark.parametrize("change", [_no_mask_lstrip, _flip_prefix_space, _no_split_regex],
                         ids=["mask-lstrip", "add-prefix-space", "split-regex"])
def test_the_byte_level_probes_catch_a_backend_built_from_another_configuration(roberta_bpe, tmp_path, change):
    """Real fastokens, built from a tokenizer.json that differs from HF's in one setting: the
    byte-level BPE set finds a text where its ids differ."""
    from tokenizers import Tokenizer

    reference = HFEncoder(Tokenizer.from_file(str(roberta_bpe)), ascii_route=False)
    wrong = FastokensEncoder(Tokenizer.from_file(_variant(roberta_bpe, tmp_path, "wrong", change)))
    assert first_difference(list(PROBE_SETS["byte-level-bpe"]), wrong, reference) is not None


class _WrongOnOneProbe(FastokensEncoder):
    """fastokens, off by one on texts holding ``trigger``."""

    trigger = "un<unk>known"  # a byte-level BPE probe only

    def encode_batch(self, texts):
        ids, lens = super().encode_batch(texts)
        bad = np.repeat(np.array([self.trigger in t for t in texts]), lens)
        return np.where(bad, ids + 1, ids).astype(np.int32), lens


def _run(path, out, objective="packed", **settings):
    from mlm_pipeline.config import build_config
    from mlm_pipeline.pipeline import run_prepare

    config = build_config({"inputs": [str(p) for p in settings.pop("inputs", CORPORA)], "output": str(out),
                           "tokenizer": str(path), "objective": objective, "split_bytes": "256KiB",
                           "block_bytes": "128KiB", "max_instances_per_shard": 2000, "dupe_factor": 1,
                           "random_seed": 777, "workers": 1, "progress": False, **settings})
    load_tokenizer.cache_clear()  # each run loads its tokenizer (and backend) afresh, as a new process does
    try:
        manifest = run_prepare(config, show_progress=False)
    finally:
        load_tokenizer.cache_clear()
    return [[s["path"], s["sha256"], s["instances"]] for s in manifest["shards"]], manifest


def test_a_backend_differing_on_one_byte_level_probe_falls_back_with_a_warning_and_a_manifest_entry(
        roberta_bpe, tmp_path, monkeypatch, caplog):
    from mlm_pipeline.tokenize import backends

    assert [p for p in probes_for("byte-level-bpe") if _WrongOnOneProbe.trigger in p] == ["un<unk>known"]
    monkeypatch.setitem(backends.BACKENDS, "fastokens", _WrongOnOneProbe)
    inputs = [SAMPLE_TEXT]
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        got, manifest = _run(roberta_bpe, tmp_path / "auto", inputs=inputs)
    assert "tokenizer backend falls back to hf" in caplog.text and "'un<unk>known'" in caplog.text
    (entry,) = manifest["tokenizer_backend"]
    assert entry["backend"] == "hf" and entry["requested"] == "auto" and entry["tasks"] == manifest["tasks"]
    assert "fastokens: self-check: ids differ from HF on probe 'un<unk>known'" in entry["fallback_reason"]
    monkeypatch.undo()
    want, hf = _run(roberta_bpe, tmp_path / "hf", inputs=inputs, tokenizer_backend="hf")
    assert got == want and {b["backend"] for b in hf["tokenizer_backend"]} == {"hf"}


def test_a_backend_that_raises_on_a_tasks_text_falls_back_for_that_task(roberta_bpe, tmp_path, monkeypatch, caplog):
    """A text past the probes and the task's check that the backend cannot encode at all (fastokens
    raises on a byte its vocabulary lacks, where HF gives the unknown token): HF encodes it, the
    run warns, names the text and records the fallback, and the shards are HF's."""
    from mlm_pipeline.tokenize import backends

    class RaisesOnZyzzyva(FastokensEncoder):
        def encode_batch(self, texts):
            if any("zyzzyva" in t for t in texts):
                raise ValueError("model error: byte 0x7a has no token in vocabulary")
            return super().encode_batch(texts)

    text = SAMPLE_TEXT.read_text(encoding="utf-8")
    corpus = tmp_path / "late.txt"
    corpus.write_text(text * 3 + "\nA zyzzyva came late.\n", encoding="utf-8")  # past the 4 KB check
    monkeypatch.setitem(backends.BACKENDS, "fastokens", RaisesOnZyzzyva)
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        got, manifest = _run(roberta_bpe, tmp_path / "auto", inputs=[corpus], objective="nsp")
    assert "falls back to hf: ValueError (model error" in caplog.text and "A zyzzyva came late." in caplog.text
    fallbacks = [b for b in manifest["tokenizer_backend"] if b.get("fallback_from") == "fastokens"]
    assert fallbacks and "zyzzyva" in fallbacks[0]["fallback_reason"]
    monkeypatch.undo()
    want, _ = _run(roberta_bpe, tmp_path / "hf", inputs=[corpus], objective="nsp", tokenizer_backend="hf")
    assert got == want


@pytest.mark.slow
@pytest.mark.parametrize("objective, wwm", [("packed", False), ("packed", True), ("tokens", False), ("nsp", False),
                                            ("nsp", True), ("sop", True)])
def test_default_and_hf_backends_write_the_same_bytes_for_a_byte_level_bpe(roberta_bpe, tmp_path, objective, wwm):
    """Every bundled corpus, as Parquet (tokens, nsp) or TFRecord: the default run encodes with
    fastokens throughout (no fallback), and its shards are byte for byte those of --tokenizer-backend hf."""
    settings = {"do_whole_word_mask": wwm, "format": "parquet" if objective in ("tokens", "nsp") else "tfrecord"}
    got, manifest = _run(roberta_bpe, tmp_path / "auto", objective, **settings)
    assert [b["backend"] for b in manifest["tokenizer_backend"]] == ["fastokens"]
    assert "fallback_reason" not in manifest["tokenizer_backend"][0]
    want, hf = _run(roberta_bpe, tmp_path / "hf", objective, tokenizer_backend="hf", **settings)
    assert [b["backend"] for b in hf["tokenizer_backend"]] == ["hf"]
    assert got == want and manifest["totals"]["instances"] > 1000


def test_whole_word_masking_keys_off_the_word_start_marker(roberta_bpe, tmp_path):
    """Tokens with ``Ġ`` start words, the others continue them; in a whole-word run every masked
    word is masked whole: a masked continuation's word start is masked, and so is the next
    continuation after a masked token."""
    import pyarrow.parquet as pq

    tok = TextTokenizer(str(roberta_bpe))
    vocab = tok.tokenizer.get_vocab()
    assert not tok.is_continuation[vocab["\u0120the"]] and tok.is_continuation[vocab["ing"]]
    assert not tok.is_continuation[[tok.special.cls, tok.special.sep, tok.special.mask, tok.special.pad]].any()
    _, manifest = _run(roberta_bpe, tmp_path / "wwm", "packed", inputs=[WIKITEXT], format="parquet",
                       do_whole_word_mask=True, split_bytes="1MiB")
    table = pq.read_table(tmp_path / "wwm" / manifest["shards"][0]["path"]).to_pylist()
    whole = partial = 0
    for row in table:
        ids = np.array(row["input_ids"])
        n = len(ids)
        positions = [p for p, w in zip(row["masked_lm_positions"], row["masked_lm_weights"]) if w > 0] \
            if "masked_lm_weights" in row else list(row["masked_lm_positions"])
        original = ids.copy()
        original[positions] = [row["masked_lm_ids"][i] for i in range(len(positions))]
        cont = tok.is_continuation[original]
        masked = np.zeros(n, bool)
        masked[positions] = True
        for p in positions:
            if p + 1 < n and cont[p + 1] and not masked[p + 1] and original[p + 1] not in tok.special_id_array:
                partial += 1
            else:
                whole += 1
    assert whole > 1000 and partial == 0, (whole, partial)  # (token masking: 2,700 of 29,000 cut a word)


def test_unknown_words_of_a_bpe_without_an_unknown_token_of_its_own_are_its_added_token(roberta_bpe):
    """RoBERTa's BPE makes ``<unk>`` only where the text spells it (an added token): the words
    the report lists are counted from the ids, and they are what HF's offsets span."""
    tok = TextTokenizer(str(roberta_bpe))
    from mlm_pipeline.tokenize.unknown_words import literal_unknown

    assert literal_unknown(tok) == "<unk>"
    lines = [s for s in _lines(WIKITEXT) if "<unk>" in s][:200] + ["a<unk>b <unk><unk>", "no unknown here"]
    want = [text[a:b] for text, enc in zip(lines, tok.tokenizer.encode_batch(lines, add_special_tokens=False))
            for i, (a, b) in zip(enc.ids, enc.offsets) if i == tok.unk_id]
    assert tok.unknown_words(lines) == want and len(want) > 200
