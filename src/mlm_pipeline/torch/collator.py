"""Batching samples into model inputs, with static masks or dynamic masking (vectorised torch).

Dynamic masking follows ``create_pretraining_data.py`` per instance: ``k = min(max_predictions,
max(1, round(length * mlm_probability)))`` positions (``length`` counts ``[CLS]``/``[SEP]``;
rounding half to even), never a special token; with whole-word masking, words are visited in a
random order and taken whole while they fit (a word that would overflow ``k`` is skipped, so no
word is ever partly masked). Each chosen position becomes the mask token with probability 0.8,
a uniformly random vocabulary id with 0.1, and stays itself with 0.1.

Words come from the tokenizer's ``is_continuation`` table (WordPiece ``##`` pieces; for
byte-level BPE and SentencePiece, tokens without the ``Ġ``/``▁`` word-start marker, the marker
decided by the tokenizer's model and pre-tokenizer). A token right after a special token or
padding always starts a word. Other schemes of :mod:`mlm_pipeline.masking` (``ngram``,
``span``) run the registry's code on the batch's rows laid end to end, with their draws taken
from the same counter-based hash.

ELECTRA's masking (``masking="electra"``, for outputs of ``--objective electra``) is
google-research/electra's, from :mod:`mlm_pipeline.electra_masking`: ``k`` positions drawn
*with replacement* among the non-special tokens, 85% ``[MASK]`` and 15% kept (no random
tokens), at most ``int((p + 0.005) * max_seq_length)`` predictions.

Randomness is counter-based: every draw is a hash (MurmurHash3's 32-bit mixing) of ``(seed,
epoch, sample index, position, purpose)``, computed for the whole batch at once. A sample's mask
therefore depends on nothing but the sample and the epoch — not on the batch it lands in, the
number of workers or ranks, or what was drawn before (so it also survives a resume).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

IGNORE_INDEX = -100

_M32 = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593  # MurmurHash3 x86_32 block constants
_F1, _F2 = 0x85EBCA6B, 0xC2B2AE35  # its finaliser
_PURPOSE_CHOOSE, _PURPOSE_REPLACE, _PURPOSE_RANDOM_ID = 1, 2, 3
_PURPOSE_ELECTRA_CHOOSE, _PURPOSE_ELECTRA_REPLACE = 4, 5
MASKINGS = ("static", "dynamic", "electra")
ATTENTIONS = ("padded", "block-diagonal", "unpadded")
SENTENCE_LABELS = ("next_sentence_label", "sentence_order_label")  # the HF models' argument names


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 ``x`` in ``[0, 2**32)``, without int64 overflow."""
    lo = (x & 0xFFFF) * c
    hi = (((x >> 16) * c) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix(h: torch.Tensor, word) -> torch.Tensor:
    """One MurmurHash3 block step: fold a 32-bit ``word`` into the state ``h``."""
    k = _mul32(_rotl32(_mul32(word & _M32, _C1), 15), _C2)
    h = _rotl32(h ^ k, 13)
    return (h * 5 + 0xE6546B64) & _M32


def _finish(h: torch.Tensor, n_words: int) -> torch.Tensor:
    h = h ^ n_words
    h = h ^ (h >> 16)
    h = _mul32(h, _F1)
    h = h ^ (h >> 13)
    h = _mul32(h, _F2)
    return h ^ (h >> 16)


def sample_keys(seed: int, epoch: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Per-sample hash state from ``(seed, epoch, index)`` (int64 tensors of shape ``[B]``)."""
    h = torch.full_like(index, seed & _M32)
    for word in ((seed >> 32) & _M32, epoch & _M32, index & _M32, (index >> 32) & _M32):
        h = _mix(h, word if isinstance(word, torch.Tensor) else torch.full_like(index, word))
    return h


def uniform(keys: torch.Tensor, positions: torch.Tensor, purpose: int) -> torch.Tensor:
    """float32 in ``[0, 1)``, one per (key, position); ``keys`` broadcasts against ``positions``."""
    h = _mix(keys, positions)
    h = _mix(h, torch.full_like(h, purpose))
    h = _finish(h, 7)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


def num_to_predict(lengths: torch.Tensor, probability: float, max_predictions: int | None) -> torch.Tensor:
    k = torch.clamp(torch.round(lengths.to(torch.float64) * probability).to(torch.int64), min=1)
    return k if max_predictions is None else torch.clamp(k, max=max_predictions)


def choose_tokens(cand: torch.Tensor, u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B, L]``: in each row, the ``k`` candidates with the smallest ``u``."""
    keys = torch.where(cand, u, torch.full_like(u, 2.0))
    order = torch.argsort(keys, dim=1, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(cand.shape[1]).expand_as(order))
    return (rank < k[:, None]) & cand


def choose_whole_words(cand: torch.Tensor, continuation: torch.Tensor, u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B, L]``: whole words in order of their first token's ``u``, each if it fits."""
    n, width = cand.shape
    prev_cand = torch.zeros_like(cand)
    prev_cand[:, 1:] = cand[:, :-1]
    starts = cand & (~continuation | ~prev_cand)
    flat_starts = starts.reshape(-1)
    flat_cand = cand.reshape(-1)
    start_pos = torch.nonzero(flat_starts).squeeze(1)
    n_words = len(start_pos)
    if n_words == 0:
        return torch.zeros_like(cand)
    word_of_pos = torch.cumsum(flat_starts.to(torch.int64), 0) - 1  # valid at candidate positions
    word_len = torch.bincount(word_of_pos[flat_cand], minlength=n_words)
    word_row = start_pos // width
    word_key = u.reshape(-1)[start_pos]
    order = torch.argsort(word_key, stable=True)
    order = order[torch.argsort(word_row[order], stable=True)]  # by row, then key
    words_per_row = torch.bincount(word_row, minlength=n)
    row_first = torch.cumsum(words_per_row, 0) - words_per_row
    rank_in_row = torch.arange(n_words) - torch.repeat_interleave(row_first, words_per_row)
    max_words = int(words_per_row.max())
    lengths = torch.zeros(n, max_words, dtype=torch.int64)
    ids = torch.full((n, max_words), -1, dtype=torch.int64)
    rows_sorted = word_row[order]
    lengths[rows_sorted, rank_in_row] = word_len[order]
    ids[rows_sorted, rank_in_row] = order
    count = torch.zeros(n, dtype=torch.int64)
    accepted = torch.zeros(n, max_words, dtype=torch.bool)
    for j in range(max_words):  # word rank, vectorised over the batch
        lj = lengths[:, j]
        take = (lj > 0) & (count + lj <= k)
        accepted[:, j] = take
        count += torch.where(take, lj, 0)
        if bool((count >= k).all()):
            break
    chosen_word = torch.zeros(n_words, dtype=torch.bool)
    chosen_word[ids[accepted]] = True
    chosen = flat_cand & chosen_word[word_of_pos.clamp(min=0)]
    return chosen.reshape(n, width)


class HashDraws:
    """A masking scheme's draws at load time: hashes of (the sample's key, column, purpose), so a
    sample's mask depends on the sample and the epoch only (see the module docstring)."""

    def __init__(self, keys: torch.Tensor):
        self.keys = keys

    def grid(self, rows: np.ndarray, width: int, purpose: int) -> np.ndarray:
        cols = torch.arange(width, dtype=torch.int64)[None, :].expand(len(rows), width)
        return uniform(self.keys[torch.from_numpy(np.asarray(rows, dtype=np.int64))][:, None], cols, purpose).numpy()

    def at(self, rows: np.ndarray, cols: np.ndarray, purpose: int) -> np.ndarray:
        rows = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        return uniform(self.keys[rows], torch.from_numpy(np.asarray(cols, dtype=np.int64)), purpose).numpy()


class MLMCollator:
    """Collate :class:`~mlm_pipeline.torch.MLMDataset` samples into ``BertForPreTraining`` inputs.

    Args:
        tokenizer: a :class:`mlm_pipeline.tokenize.TextTokenizer` (or a path to load one): the
            mask and pad ids, vocabulary size, special ids and word boundaries.
        masking: ``"static"``: the masks stored in the shards; ``"dynamic"``: draw new masks at
            load time (from pre-masked shards, the original tokens are restored first), BERT's
            80/10/10; ``"electra"``: ELECTRA's masking at load time (see above).
        mlm_probability, max_predictions: ``k`` per instance as above (``None``: no cap; for
            ELECTRA's masking ``None`` is its ``int((p + 0.005) * L)`` with ``L`` = ``max_length``,
            so it needs one of the two).
        whole_word_mask: mask whole words (dynamic masking only): ``masking_scheme="whole-word"``.
        masking_scheme: the scheme of dynamic masking, a name of :mod:`mlm_pipeline.masking`'s
            registry: ``token`` (the default), ``whole-word``, ``ngram`` (ALBERT's), ``span``
            (SpanBERT's, 80/10/10 per span); ``ngram``, ``favor_shorter_ngram``, ``geometric_p``,
            ``span_lower``, ``span_upper`` are their parameters, as ``prepare``'s flags.
        word_continuation: per vocabulary id, whether the token continues a word, for the schemes
            that mask words; default: the tokenizer's ``is_continuation``. ``dataset.collator()``
            gives the objective's rule (``sop``: ALBERT's words, those of ``token_boundary``).
        seed: seed of the dynamic masks (with the sample's ``epoch`` and ``index``).
        nsp: include the samples' pair label (for ``BertForPreTraining`` or
            ``AlbertForPreTraining``; leave out for ``BertForMaskedLM``).
        sentence_label: the batch key of that label: ``next_sentence_label`` (BERT's) or
            ``sentence_order_label`` (``AlbertForPreTraining``'s).
        pad_to_multiple_of: round the padded length up (e.g. 8); ``max_length``: pad to exactly
            this length (longer samples are an error).
        sample_info: also return ``sample_index`` (int64) and ``sample_weight`` (float32, 0 for
            padding samples) — not model inputs, pop them before ``model(**batch)``.
        attention: how attention is kept inside each document of a packed row (the samples'
            ``document_starts``; a sample without them is one document). ``"padded"`` (the
            default): a ``[B, L]`` ``attention_mask``, documents of a row see each other.
            ``"block-diagonal"``: ``attention_mask`` is a bool ``[B, 1, L, L]``, True where query
            and key are in the same document (padding sees only padding), and ``position_ids``
            ``[B, L]`` restart at 0 in each document (0 on padding): plain PyTorch attention
            (``scaled_dot_product_attention``, HF's ``sdpa``). ``"unpadded"``: the rows back to back
            without padding, FlashAttention's variable-length form: ``input_ids``,
            ``token_type_ids``, ``labels`` and ``position_ids`` of shape ``[1, T]`` (``T`` the
            batch's tokens), ``cu_seqlens`` (int32, each document's start in the flat batch, then
            ``T``) and ``max_seqlen`` (int, the longest document); no ``attention_mask``.
        language_ids: language code -> id (``dataset.language_ids``, the manifest's table): also
            return ``langs`` (int64 ``[B, L]``, the sample's language id at every position, padding
            included), XLM's input to its language embeddings. Samples need their ``language``
            (outputs prepared with ``--language``).

    Returns a dict of tensors: ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64
    ``[B, L]``), ``labels`` (int64 ``[B, L]``, the original id at masked positions, -100
    elsewhere) and, with ``nsp``, ``next_sentence_label`` or ``sentence_order_label``
    (``sentence_label``; int64 ``[B]``, -100 where unknown).
    Padding samples (``weight`` 0) get no labels at all, so they add nothing to any loss.
    """

    def __init__(
        self,
        tokenizer,
        *,
        masking: str = "dynamic",
        mlm_probability: float = 0.15,
        max_predictions: int | None = None,
        whole_word_mask: bool = False,
        masking_scheme: str | None = None,
        ngram: int = 3,
        favor_shorter_ngram: bool = True,
        geometric_p: float = 0.2,
        span_lower: int = 1,
        span_upper: int = 10,
        word_continuation: np.ndarray | None = None,
        seed: int = 0,
        nsp: bool = True,
        sentence_label: str = "next_sentence_label",
        pad_to_multiple_of: int | None = None,
        max_length: int | None = None,
        sample_info: bool = False,
        attention: str = "padded",
        language_ids: dict[str, int] | None = None,
    ):
        if isinstance(tokenizer, str):
            from mlm_pipeline.tokenize import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        if masking not in MASKINGS:
            raise ValueError(f"masking must be one of {', '.join(MASKINGS)}, got {masking!r}")
        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
        if max_predictions is not None and max_predictions < 1:
            raise ValueError(f"max_predictions must be >= 1 or None, got {max_predictions}")
        if masking == "electra" and max_length is None and max_predictions is None:
            raise ValueError("masking='electra' draws int((p + 0.005) * L) positions, L the length the shards were cut "
                             "to: give max_length (dataset.collator() sets it from the manifest) or max_predictions; "
                             "from the batch's width, an instance's mask would depend on the batch it is in")
        if whole_word_mask and masking != "dynamic":
            raise ValueError("whole_word_mask applies to dynamic masking (not to static or ELECTRA's masking)")
        if whole_word_mask and masking_scheme not in (None, "whole-word"):
            raise ValueError(f"whole_word_mask asks for masking_scheme='whole-word', not {masking_scheme!r}")
        scheme = "whole-word" if whole_word_mask else masking_scheme or "token"
        if scheme != "token" and masking != "dynamic":
            raise ValueError(f"masking_scheme={scheme!r} applies to dynamic masking (not to static or ELECTRA's masking)")
        from mlm_pipeline.masking import get_masking_scheme  # (ConfigError, a ValueError, for an unknown name)

        self._scheme = get_masking_scheme(scheme)
        if self._scheme.whole_words != "never" and getattr(tokenizer, "word_marker", True) is None:
            raise ValueError(f"masking_scheme={scheme!r} masks whole words, but the tokenizer marks no word "
                             "boundaries (no ## pieces, no ▁ or Ġ word starts)")
        self._scheme_params = dict(ngram=ngram, favor_shorter_ngram=favor_shorter_ngram, geometric_p=geometric_p,
                                   span_lower=span_lower, span_upper=span_upper)
        if ngram < 1 or not 0.0 < geometric_p <= 1.0 or not 1 <= span_lower <= span_upper:
            raise ValueError(f"bad masking scheme parameters: {self._scheme_params}")
        if sentence_label not in SENTENCE_LABELS:
            raise ValueError(f"sentence_label must be one of {', '.join(SENTENCE_LABELS)}, got {sentence_label!r}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
        self.attention = attention
        self.masking = masking
        self.mlm_probability = float(mlm_probability)
        self.max_predictions = max_predictions
        self.whole_word_mask = scheme == "whole-word"
        self.masking_scheme = scheme
        self.seed = seed
        self.nsp = bool(nsp)
        self.sentence_label = sentence_label
        self.pad_to_multiple_of = pad_to_multiple_of
        self.max_length = max_length
        self.sample_info = bool(sample_info)
        if language_ids is not None and not all(isinstance(v, int) and v >= 0 for v in language_ids.values()):
            raise ValueError(f"language_ids maps language codes to non-negative ints, got {language_ids!r}")
        self.language_ids = None if language_ids is None else dict(language_ids)
        self._masks_seen = masking != "static"  # static: until a batch shows stored masks
        # what made its ids, for MLMDataLoader to compare with the shards' tokenizer
        self.tokenizer_fingerprint = getattr(tokenizer, "fingerprint", None)
        self.tokenizer_path = getattr(tokenizer, "path", None)
        self.mask_id = int(tokenizer.special.mask)
        self.pad_id = int(tokenizer.special.pad)
        sp = tokenizer.special  # ELECTRA never masks [CLS], [SEP], [MASK] or [PAD]
        self._electra_ignore = np.array([sp.cls, sp.sep, sp.mask, sp.pad], dtype=np.int64)
        self.vocab_size = int(tokenizer.vocab_size)
        special = torch.zeros(max(self.vocab_size, int(tokenizer.special_id_array.max()) + 1), dtype=torch.bool)
        special[torch.from_numpy(tokenizer.special_id_array.astype(np.int64))] = True
        self._special = special
        table = tokenizer.is_continuation if word_continuation is None else word_continuation
        cont = torch.from_numpy(np.asarray(table, dtype=bool))
        self._continuation = torch.zeros(len(special), dtype=torch.bool)
        self._continuation[: min(len(cont), len(special))] = cont[: len(special)]

    def _lookup(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return table[ids.clamp(0, len(table) - 1)]

    def __call__(self, samples: Sequence[dict]) -> dict[str, torch.Tensor]:
        n = len(samples)
        if n == 0:
            raise ValueError("cannot collate an empty list of samples")
        lengths = np.fromiter((len(s["input_ids"]) for s in samples), dtype=np.int64, count=n)
        width = int(lengths.max())
        if self.max_length is not None:
            if width > self.max_length:
                raise ValueError(f"a sample of length {width} exceeds max_length {self.max_length}")
            width = self.max_length
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        rows = np.repeat(np.arange(n), lengths)
        cols = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        input_ids = np.full((n, width), self.pad_id, dtype=np.int64)
        input_ids[rows, cols] = np.concatenate([s["input_ids"] for s in samples])
        token_type = np.zeros((n, width), dtype=np.int64)
        token_type[rows, cols] = np.concatenate([s["token_type_ids"] for s in samples])
        mcounts = np.fromiter((len(s["masked_lm_positions"]) for s in samples), dtype=np.int64, count=n)
        mrows = np.repeat(np.arange(n), mcounts)
        mpos = np.concatenate([s["masked_lm_positions"] for s in samples]).astype(np.int64)
        mids = np.concatenate([s["masked_lm_ids"] for s in samples]).astype(np.int64)
        weight = torch.tensor([float(s.get("weight", 1.0)) for s in samples], dtype=torch.float32)
        if not self._masks_seen:
            self._check_stored_masks(mcounts, weight)

        ids = torch.from_numpy(input_ids)
        attention = torch.from_numpy((np.arange(width)[None, :] < lengths[:, None]).astype(np.int64))
        labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.int64)
        if self.masking == "static":
            labels[mrows, mpos] = torch.from_numpy(mids)
        else:
            ids[mrows, mpos] = torch.from_numpy(mids)  # undo stored masks: the original tokens
            index = torch.tensor([int(s["index"]) for s in samples], dtype=torch.int64)
            epoch = torch.tensor([int(s.get("epoch", 0)) for s in samples], dtype=torch.int64)
            keys = sample_keys(self.seed, epoch, index)
            if self.masking == "electra":
                ids, labels = self.electra_mask(ids, attention, keys)
            else:
                ids, labels = self.mask(ids, attention.bool(), keys)
        labels[weight == 0] = IGNORE_INDEX
        batch = {
            "input_ids": ids,
            "attention_mask": attention,
            "token_type_ids": torch.from_numpy(token_type),
            "labels": labels,
        }
        if self.nsp:
            nsp = torch.tensor([int(s["next_sentence_label"]) for s in samples], dtype=torch.int64)
            nsp[(nsp < 0) | (weight == 0)] = IGNORE_INDEX
            batch[self.sentence_label] = nsp
        if self.language_ids is not None:  # XLM's language embeddings: the row's language id at every token
            missing = {s.get("language") for s in samples} - set(self.language_ids)
            if missing:
                raise ValueError(f"samples of language {', '.join(map(str, sorted(missing, key=str)))} have no id "
                                 f"in language_ids ({', '.join(sorted(self.language_ids))}); None: the output was "
                                 "prepared without languages")
            row_ids = torch.tensor([self.language_ids[s["language"]] for s in samples], dtype=torch.int64)
            batch["langs"] = row_ids[:, None].expand(n, width).clone()
        if self.sample_info:
            batch["sample_index"] = torch.tensor([int(s["index"]) for s in samples], dtype=torch.int64)
            batch["sample_weight"] = weight
        if self.attention != "padded":
            documents_apart(batch, samples, lengths, self.attention)
        return batch

    def _check_stored_masks(self, mcounts: np.ndarray, weight: torch.Tensor) -> None:
        """Static masking reads the masks in the shards: a first batch whose samples hold none is
        from shards prepared without masks, and every label would be -100 (a NaN loss, no error).
        MLMDataLoader and ``dataset.collator`` refuse that up front; a plain DataLoader (the HF
        Trainer's) does not know the output, so the collator looks at what it is given."""
        real = (weight > 0).numpy()
        if not real.any():  # only padding samples: nothing to tell yet
            return
        if int(mcounts[real].sum()) == 0:
            raise ValueError("masking='static' uses the masks stored in the shards, and these samples have none: "
                             "the output was prepared without masks (masking: none), so every label would be -100; "
                             "use masking='dynamic' (or dataset.collator(), which picks the output's masking)")
        self._masks_seen = True

    def electra_mask(self, ids: torch.Tensor, attention: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ELECTRA's masking of clean ``ids`` ``[B, L]``: (corrupted ids, labels with -100); the
        draws of prediction slot ``j`` of a row are hashes of (the row's key, ``j``)."""
        from mlm_pipeline.electra_masking import electra_mask, max_predictions_per_seq

        n = ids.shape[0]
        slots = self.max_predictions or max_predictions_per_seq(self.max_length, self.mlm_probability)
        pos = torch.arange(slots, dtype=torch.int64)[None, :].expand(n, slots)
        masked = electra_mask(
            ids.numpy(), attention.numpy(), mask_id=self.mask_id, ignore_ids=self._electra_ignore,
            choose_u=uniform(keys[:, None], pos, _PURPOSE_ELECTRA_CHOOSE).numpy(),
            replace_u=uniform(keys[:, None], pos, _PURPOSE_ELECTRA_REPLACE).numpy(),
            max_predictions=slots, mask_prob=self.mlm_probability,
        )
        return torch.from_numpy(masked.input_ids), torch.from_numpy(masked.labels(IGNORE_INDEX))

    def _choose_by_scheme(self, ids: torch.Tensor, attention: torch.Tensor, cand: torch.Tensor, k: torch.Tensor,
                          keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(rows, columns, each position's group's first column or None) chosen by the registry's
        scheme, on the rows' tokens laid end to end (the layout ``prepare`` masks)."""
        from mlm_pipeline.instances.batch import lengths_to_offsets
        from mlm_pipeline.masking.base import MaskingSpec, Selection

        mask = attention.numpy()
        lengths = mask.sum(axis=1)
        offsets = lengths_to_offsets(lengths)
        spec = MaskingSpec(self.mlm_probability, self.max_predictions or 1 << 30, self.vocab_size,
                           self.mask_id, np.flatnonzero(self._special.numpy()),
                           self._scheme.whole_words != "never", self._continuation.numpy(),
                           scheme=self.masking_scheme, **self._scheme_params)
        selection = Selection(ids=ids.numpy()[mask], offsets=offsets, cand=cand.numpy()[mask],
                              k=k.numpy().astype(np.int64), spec=spec)
        chosen = self._scheme.choose(selection, HashDraws(keys))
        rows = np.searchsorted(offsets, chosen.positions, side="right") - 1
        cols = chosen.positions - offsets[rows]
        first = None
        if self._scheme.per_group and chosen.groups is not None and len(cols):
            new = np.ones(len(cols), dtype=bool)
            new[1:] = chosen.groups[1:] != chosen.groups[:-1]  # a group's positions are together
            first = torch.from_numpy(cols[np.flatnonzero(new)[np.cumsum(new) - 1]])
        return torch.from_numpy(rows), torch.from_numpy(cols), first

    def mask(self, ids: torch.Tensor, attention: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dynamic masking of clean ``ids`` ``[B, L]``: (corrupted ids, labels with -100).

        ``keys`` (``[B]``, from :func:`sample_keys`) seed each row's draws.
        """
        n, width = ids.shape
        cand = attention & ~self._lookup(self._special, ids)
        pos = torch.arange(width, dtype=torch.int64)[None, :]
        k = torch.minimum(
            num_to_predict(attention.sum(1), self.mlm_probability, self.max_predictions), cand.sum(1)
        )
        first_cols = None
        if self.masking_scheme in ("token", "whole-word"):  # (the torch forms of the two schemes)
            u = uniform(keys[:, None], pos.expand(n, width), _PURPOSE_CHOOSE)
            if self.whole_word_mask:
                chosen = choose_whole_words(cand, self._lookup(self._continuation, ids), u, k)
            else:
                chosen = choose_tokens(cand, u, k)
            m_rows, m_cols = torch.nonzero(chosen, as_tuple=True)
        else:
            m_rows, m_cols, first_cols = self._choose_by_scheme(ids, attention, cand, k, keys)
        original = ids[m_rows, m_cols]
        r = uniform(keys[m_rows], m_cols if first_cols is None else first_cols, _PURPOSE_REPLACE)
        random_ids = (uniform(keys[m_rows], m_cols, _PURPOSE_RANDOM_ID).to(torch.float64) * self.vocab_size).to(torch.int64)
        new = torch.where(r < 0.8, torch.full_like(original, self.mask_id), torch.where(r < 0.9, random_ids, original))
        out = ids.clone()
        out[m_rows, m_cols] = new
        labels = torch.full_like(ids, IGNORE_INDEX)
        labels[m_rows, m_cols] = original
        return out, labels


def _document_starts(samples: Sequence[dict], lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every sample's document starts (``[0]`` for a sample without them), checked, back to back:
    (starts int64, documents per sample int64)."""
    parts = [np.asarray(s.get("document_starts", (0,)), dtype=np.int64) for s in samples]
    counts = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    starts = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    row = np.repeat(np.arange(len(parts)), counts)
    first = np.zeros(len(starts), bool)
    first[np.cumsum(counts) - counts] = True
    steps = np.diff(starts, prepend=0)
    if (counts < 1).any() or (starts[first] != 0).any() or (steps[~first] <= 0).any() or (starts >= lengths[row]).any():
        raise ValueError("a sample's document_starts must begin with 0 and ascend within the sample's length")
    return starts, counts


def documents_apart(batch: dict, samples: Sequence[dict], lengths: np.ndarray, attention: str) -> None:
    """Turn a padded batch into the ``block-diagonal`` or ``unpadded`` form (see :class:`MLMCollator`),
    in place: position ids restart at every document start; no position attends across one."""
    n, width = batch["input_ids"].shape
    starts, counts = _document_starts(samples, lengths)
    first_doc = np.cumsum(counts) - counts  # each row's first document, numbered over the batch
    row = np.repeat(np.arange(n), counts)
    begins = np.zeros((n, width), np.int32)
    begins[row, starts] = 1  # (a row's starts are distinct)
    doc_in_row = np.cumsum(begins, axis=1, dtype=np.int32) - 1  # each position's document within its row
    document = first_doc[:, None] + doc_in_row
    valid = np.arange(width)[None, :] < lengths[:, None]
    positions = np.where(valid, np.arange(width)[None, :] - starts[document], 0)
    if attention == "block-diagonal":
        document = np.where(valid, document, -1).astype(np.int32)  # padding: a document of its own
        doc = torch.from_numpy(document)
        batch["attention_mask"] = (doc[:, :, None] == doc[:, None, :])[:, None]
        batch["position_ids"] = torch.from_numpy(positions)
        return
    flat = torch.from_numpy(valid.reshape(-1))
    for key in ("input_ids", "token_type_ids", "labels", "langs"):
        if key in batch:
            batch[key] = batch[key].reshape(-1)[flat][None, :]
    batch.pop("attention_mask")
    batch["position_ids"] = torch.from_numpy(positions.reshape(-1)[valid.reshape(-1)])[None, :]
    row_offsets = np.cumsum(lengths) - lengths
    bounds = np.append(row_offsets[row] + starts, int(lengths.sum()))
    batch["cu_seqlens"] = torch.from_numpy(bounds.astype(np.int32))
    batch["max_seqlen"] = int(np.diff(bounds).max())
