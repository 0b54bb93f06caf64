"""MLMCollator: masking statistics on real text, whole words for three tokenizer families, seeding."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from loader.loader_helpers import VOCAB, WIKITEXT, loader, run  # noqa: E402

from mlm_pipeline.tokenize import TextTokenizer, load_tokenizer  # noqa: E402
from mlm_pipeline.torch import MLMCollator, MLMDataset  # noqa: E402
from mlm_pipeline.torch.collator import num_to_predict, sample_keys, uniform  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:This DataLoader will create")]


@pytest.fixture(scope="module")
def wordpiece():
    return load_tokenizer(str(VOCAB), True)


@pytest.fixture(scope="module")
def samples(parquet_out):
    """Every instance of the real-text output (pre-masked NSP pairs), in manifest order."""
    ds = MLMDataset(parquet_out, shuffle=False, shuffle_buffer=500)
    return list(ds)


def _collate_all(collator, samples, size=64):
    return [collator(samples[i:i + size]) for i in range(0, len(samples), size)]


def _originals(batch):
    return torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])


def _split_words(batch, continuation: torch.Tensor, special: torch.Tensor) -> tuple[int, int]:
    """(words cut by the mask boundary, multi-token words masked whole) under the marker rule."""
    orig = _originals(batch)
    masked = batch["labels"] != -100
    cont = continuation[orig] & (batch["attention_mask"] == 1) & ~special[orig]
    prev_real = torch.zeros_like(cont)
    prev_real[:, 1:] = ~special[orig[:, :-1]] & (batch["attention_mask"][:, :-1] == 1)
    inside = cont & prev_real  # a piece that continues the word of the previous token
    cut = inside[:, 1:] & (masked[:, 1:] != masked[:, :-1])
    whole_multi = inside[:, 1:] & masked[:, 1:] & masked[:, :-1]
    return int(cut.sum()), int(whole_multi.sum())


@pytest.mark.parametrize("whole_word", [False, True])
def test_masking_statistics_on_real_text(wordpiece, samples, whole_word):
    collator = MLMCollator(wordpiece, masking="dynamic", whole_word_mask=whole_word, seed=11)
    batches = _collate_all(collator, samples)
    special = torch.zeros(wordpiece.vocab_size, dtype=torch.bool)
    special[torch.from_numpy(wordpiece.special_id_array.astype(np.int64))] = True
    masked = replaced_mask = replaced_random = kept = budget = tokens = 0
    for b in batches:
        sel = b["labels"] != -100
        orig, new = b["labels"][sel], b["input_ids"][sel]
        masked += int(sel.sum())
        tokens += int(b["attention_mask"].sum())
        replaced_mask += int((new == wordpiece.special.mask).sum())
        kept += int((new == orig).sum())
        replaced_random += int(((new != orig) & (new != wordpiece.special.mask)).sum())
        assert not special[_originals(b)[sel]].any()  # [CLS], [SEP], [PAD] never masked
        assert ((b["attention_mask"] == 1) | ~sel).all()  # nothing masked in padding
        real = b["attention_mask"].bool()
        cand = (real & ~special[_originals(b)]).sum(1)
        k = torch.minimum(num_to_predict(real.sum(1), 0.15, None), cand)
        per_row = sel.sum(1)
        if whole_word:
            assert (per_row <= k).all()
        else:
            assert torch.equal(per_row, k)  # exactly round(15 % of the length) per instance
        budget += int(k.sum())
    assert 0.145 < masked / tokens < 0.155
    if whole_word:
        assert masked >= 0.97 * budget
    assert masked > 25_000  # tolerances below are > 4 standard deviations
    assert abs(replaced_mask / masked - 0.8) < 0.01
    assert abs(replaced_random / masked - 0.1) < 0.01
    assert abs(kept / masked - 0.1) < 0.01
    cut, multi = (sum(x) for x in zip(*[_split_words(b, torch.from_numpy(wordpiece.is_continuation), special)
                                        for b in batches]))
    if whole_word:
        assert cut == 0 and multi > 500
    else:
        assert cut > 1000  # token masking does cut words: the check above has teeth


def _train_tokenizer(kind: str, path) -> TextTokenizer:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    lines = [ln.strip() for ln in open(WIKITEXT, encoding="utf-8").readlines()[:3000] if ln.strip()]
    specials = ["<pad>", "<s>", "</s>", "<unk>", "<mask>"]
    if kind == "byte-level-bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:  # SentencePiece style: Unigram over Metaspace words
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=3000, special_tokens=specials, unk_token="<unk>")
    tok.train_from_iterator(lines, trainer)
    tok.save(str(path))
    return TextTokenizer(str(path))


@pytest.mark.parametrize("kind", ["byte-level-bpe", "metaspace-unigram"])
def test_whole_words_for_tokenizers_without_wordpiece_prefixes(tmp_path, kind):
    tok = _train_tokenizer(kind, tmp_path / "tokenizer.json")
    assert tok.special.mask == tok.tokenizer.token_to_id("<mask>")
    lines = [ln.strip() for ln in open(WIKITEXT, encoding="utf-8").readlines()[3000:4500] if len(ln.strip()) > 40]
    encodings = tok.tokenizer.encode_batch(lines, add_special_tokens=False)
    samples, words = [], []
    for i, enc in enumerate(encodings):
        ids = [tok.special.cls] + enc.ids[:126] + [tok.special.sep]
        samples.append({
            "input_ids": np.array(ids, np.int32), "token_type_ids": np.zeros(len(ids), np.int8),
            "masked_lm_positions": np.zeros(0, np.int32), "masked_lm_ids": np.zeros(0, np.int32),
            "next_sentence_label": -1, "index": i, "epoch": 0, "weight": 1.0,
        })
        words.append([None] + enc.word_ids[:126] + [None])
    collator = MLMCollator(tok, masking="dynamic", whole_word_mask=True, nsp=False, seed=5)
    batches = _collate_all(collator, samples, size=32)
    special = torch.zeros(len(tok.is_continuation), dtype=torch.bool)
    special[torch.from_numpy(tok.special_id_array.astype(np.int64))] = True
    cut = multi = masked = tokens = 0
    for b in batches:
        c, m = _split_words(b, torch.from_numpy(tok.is_continuation), special)
        cut += c
        multi += m
        masked += int((b["labels"] != -100).sum())
        tokens += int(b["attention_mask"].sum())
    assert cut == 0 and multi > 200
    assert 0.14 < masked / tokens < 0.155
    if kind == "metaspace-unigram":
        # SentencePiece words are exactly the pre-tokenizer's words: check against its word_ids
        labels = torch.cat([b["labels"] for b in batches])
        for row, word_ids in enumerate(words):
            by_word: dict[int, set] = {}
            for pos, w in enumerate(word_ids):
                if w is not None:
                    by_word.setdefault(w, set()).add(bool(labels[row, pos] != -100))
            assert all(len(states) == 1 for states in by_word.values()), row


def test_masks_depend_only_on_seed_epoch_and_index(wordpiece, samples):
    collator = MLMCollator(wordpiece, masking="dynamic", seed=3)
    picked = samples[:40]
    a = collator(picked)
    b = collator(picked[::-1][:25] + picked[::-1][25:])  # other order, other batch shape
    for i, s in enumerate(picked):
        j = 39 - i
        n = len(s["input_ids"])
        assert torch.equal(a["labels"][i, :n], b["labels"][j, :n])
        assert torch.equal(a["input_ids"][i, :n], b["input_ids"][j, :n])
    other_epoch = collator([dict(s, epoch=1) for s in picked])
    other_seed = MLMCollator(wordpiece, masking="dynamic", seed=4)(picked)
    assert not torch.equal(other_epoch["labels"], a["labels"])
    assert not torch.equal(other_seed["labels"], a["labels"])


def test_dynamic_masks_do_not_depend_on_workers_or_ranks(parquet_out):
    def masks(world, workers):
        out = {}
        for rank in range(world):
            for b in run(loader(parquet_out, rank=rank, world=world, workers=workers, masking="dynamic")):
                for i, idx in enumerate(b["sample_index"].tolist()):
                    out[idx] = b["labels"][i][b["attention_mask"][i] == 1]
        return out

    base = masks(1, 0)
    for world, workers in ((2, 2), (3, 1)):
        other = masks(world, workers)
        assert other.keys() == base.keys()
        assert all(torch.equal(other[k], base[k]) for k in base)


def test_static_masks_are_the_stored_ones(wordpiece, samples):
    b = MLMCollator(wordpiece, masking="static")(samples[:50])
    for i, s in enumerate(samples[:50]):
        n = len(s["input_ids"])
        assert b["input_ids"][i, :n].tolist() == s["input_ids"].tolist()
        assert torch.nonzero(b["labels"][i] != -100).squeeze(1).tolist() == s["masked_lm_positions"].tolist()
        assert b["labels"][i][b["labels"][i] != -100].tolist() == s["masked_lm_ids"].tolist()
        assert int(b["next_sentence_label"][i]) == s["next_sentence_label"]
        assert b["attention_mask"][i].sum() == n and (b["input_ids"][i, n:] == wordpiece.special.pad).all()


def test_dynamic_masking_of_pre_masked_shards_starts_from_the_original_tokens(wordpiece, samples):
    b = MLMCollator(wordpiece, masking="dynamic", seed=1)(samples[:50])
    for i, s in enumerate(samples[:50]):
        original = s["input_ids"].astype(np.int64).copy()
        original[s["masked_lm_positions"]] = s["masked_lm_ids"]
        n = len(original)
        restored = _originals(b)[i, :n].numpy()
        np.testing.assert_array_equal(restored, original)
        assert wordpiece.special.mask not in b["input_ids"][i, :n][b["labels"][i, :n] == -100].tolist()


def test_padding_options_and_padding_samples(wordpiece, samples):
    picked = [dict(s) for s in samples[:6]]
    picked[2]["weight"] = 0.0
    picked[3]["next_sentence_label"] = -1
    c = MLMCollator(wordpiece, masking="dynamic", pad_to_multiple_of=48, sample_info=True)
    b = c(picked)
    assert b["input_ids"].shape[1] % 48 == 0
    assert (b["labels"][2] == -100).all() and b["next_sentence_label"][2] == -100
    assert b["next_sentence_label"][3] == -100
    assert b["sample_weight"].tolist() == [1, 1, 0, 1, 1, 1]
    assert MLMCollator(wordpiece, max_length=128)(picked)["input_ids"].shape == (6, 128)
    with pytest.raises(ValueError, match="exceeds max_length"):
        MLMCollator(wordpiece, max_length=16)(picked)
    assert "next_sentence_label" not in MLMCollator(wordpiece, nsp=False)(picked)


def test_max_predictions_caps_the_masks(wordpiece, samples):
    capped = MLMCollator(wordpiece, masking="dynamic", mlm_probability=0.5, max_predictions=7)(samples[:64])
    free = MLMCollator(wordpiece, masking="dynamic", mlm_probability=0.5, max_predictions=512)(samples[:64])
    counts, uncapped = (capped["labels"] != -100).sum(1), (free["labels"] != -100).sum(1)
    assert (counts == torch.clamp(uncapped, max=7)).all()
    assert (counts == 7).sum() >= 60 and uncapped.max() > 7  # the cap bites on nearly every row


@pytest.mark.parametrize("kwargs", [dict(masking="other"), dict(mlm_probability=0.0), dict(max_predictions=0),
                                    dict(masking="static", whole_word_mask=True), dict(seed=-1),
                                    dict(masking="electra")])
def test_bad_settings_are_value_errors(wordpiece, kwargs):
    with pytest.raises(ValueError):
        MLMCollator(wordpiece, **kwargs)


def test_counter_based_uniforms_look_uniform():
    keys = sample_keys(7, torch.zeros(4096, dtype=torch.int64), torch.arange(4096))
    u = uniform(keys[:, None], torch.arange(64).expand(4096, 64), 1)
    assert u.min() >= 0 and u.max() < 1
    counts = torch.histc(u, bins=20, min=0, max=1)
    expected = u.numel() / 20
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 45  # 19 degrees of freedom: p < 0.001 beyond ~43.8
    # neighbouring positions and neighbouring samples are uncorrelated
    x = u - 0.5
    assert abs(float((x[:, 1:] * x[:, :-1]).mean()) / float((x * x).mean())) < 0.01
    assert abs(float((x[1:] * x[:-1]).mean()) / float((x * x).mean())) < 0.01
    assert not torch.equal(uniform(keys, torch.zeros(4096, dtype=torch.int64), 1),
                           uniform(keys, torch.zeros(4096, dtype=torch.int64), 2))


def test_a_collator_of_another_vocab_is_refused_by_the_loader(parquet_out, tmp_path):
    """A collator built on another vocab would put its own [MASK] id into the shards' ids, and
    draw random tokens from its own vocab: the loader refuses it. The run's vocab file read
    without its lower-casing is still the run's vocab, and is taken."""
    from mlm_pipeline.torch import MLMDataLoader

    lines = VOCAB.read_text().splitlines(keepends=True)
    other = tmp_path / "other-vocab.txt"  # [MASK] (103) and [UNK] (100) trade places
    other.write_text("".join(lines[:100] + [lines[103]] + lines[101:103] + [lines[100]] + lines[104:]))
    dataset = MLMDataset(parquet_out, seed=1)
    with pytest.raises(ValueError, match=r"the collator's tokenizer \(.*other-vocab.txt\) is not the one that "
                                         r"prepared .*its \[MASK\] and random tokens would be another vocab's"):
        MLMDataLoader(dataset, batch_size=8, collate_fn=MLMCollator(str(other), masking="dynamic"))
    assert MLMCollator(str(other), masking="dynamic").mask_id == 100
    for same in (str(VOCAB), load_tokenizer(str(VOCAB), False)):
        batch = next(iter(MLMDataLoader(dataset, batch_size=8, collate_fn=MLMCollator(same, masking="dynamic"))))
        assert (batch["input_ids"] == 103).any()


def test_a_static_collator_on_shards_without_masks_is_refused_by_the_loader(tiny_out):
    """Shards prepared with --masking none hold no masks: a collator built directly with
    masking='static' gave batches whose labels were all -100 (a NaN loss); refused like
    dataset.collator(masking='static'), by MLMDataLoader and, under a plain DataLoader, by the
    collator itself."""
    from mlm_pipeline.torch import MLMDataLoader

    dataset = MLMDataset(tiny_out, seed=1)
    with pytest.raises(ValueError, match=r"prepared without masks \(masking: none\)"):
        dataset.collator(masking="static")
    with pytest.raises(ValueError, match=r"prepared without masks \(masking: none\), so a collator with "
                                         r"masking='static' would give no labels"):
        MLMDataLoader(dataset, batch_size=4, collate_fn=MLMCollator(str(VOCAB), masking="static"))
    batch = next(iter(MLMDataLoader(dataset, batch_size=4, collate_fn=MLMCollator(str(VOCAB), masking="dynamic"))))
    assert (batch["labels"] != -100).any()
    # a plain DataLoader (the HF Trainer's) knows nothing of the output: the collator refuses the first batch
    static = MLMCollator(str(VOCAB), masking="static")
    samples = list(dataset)[:4]
    assert (static([dict(s, weight=0.0) for s in samples])["labels"] == -100).all()  # padding only: no verdict yet
    plain = torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=static)
    with pytest.raises(ValueError, match=r"masking='static' uses the masks stored in the shards, and these samples "
                                         r"have none: the output was prepared without masks \(masking: none\)"):
        next(iter(plain))
