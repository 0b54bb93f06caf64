"""Tokenizer loading and batched encoding to flat numpy arrays (HF ``tokenizers``, Rust).

Accepts a WordPiece ``vocab.txt`` (Google's BERT format), a ``tokenizer.json``, or a local Hugging
Face model directory holding either. Truncation and padding stored in a ``tokenizer.json`` are
switched off: instance building decides lengths, not the tokenizer.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import operator
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, normalizers
from tokenizers.implementations import BertWordPieceTokenizer

# Names of the special tokens, BERT first, then RoBERTa/XLM-R style.
_SPECIALS = {
    "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<sep>"),
    "mask": ("[MASK]", "<mask>"),
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>"),
}


# Texts per tokenizer call in ``TextTokenizer.encode_batch``.
ENCODE_BATCH = 1024


class TokenizerError(ValueError):
    """The tokenizer could not be loaded or lacks a token the pipeline needs."""


def _resolve(path: str, do_lower_case: bool) -> tuple[Tokenizer, str]:
    p = Path(path)
    if not p.exists():
        raise TokenizerError(f"tokenizer path does not exist: {path}")
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return _resolve(str(p / "tokenizer.json"), do_lower_case)
        if (p / "vocab.txt").is_file():
            cfg = p / "tokenizer_config.json"
            if cfg.is_file():
                try:
                    do_lower_case = bool(json.loads(cfg.read_text()).get("do_lower_case", do_lower_case))
                except (json.JSONDecodeError, OSError) as exc:
                    raise TokenizerError(f"cannot read {cfg}: {exc}") from exc
            return _resolve(str(p / "vocab.txt"), do_lower_case)
        raise TokenizerError(f"{path} is a directory without tokenizer.json or vocab.txt")
    if p.suffix == ".json":
        try:
            tok = Tokenizer.from_file(str(p))
        except Exception as exc:  # tokenizers raises a plain Exception on bad JSON
            raise TokenizerError(f"cannot load tokenizer.json {path}: {exc}") from exc
        return tok, "tokenizer.json"
    try:
        tok = BertWordPieceTokenizer(str(p), lowercase=do_lower_case)._tokenizer
    except Exception as exc:
        raise TokenizerError(f"cannot load WordPiece vocab {path}: {exc}") from exc
    return tok, "wordpiece-vocab"


def _continuation_table(tok: Tokenizer) -> np.ndarray:
    """``True`` for vocabulary entries that continue a word (used by whole-word masking).

    WordPiece marks continuations with a prefix (``##``); byte-level BPE and SentencePiece mark
    word *starts* (``Ġ``, ``▁``) instead, so there a token without the marker continues a word.
    """
    vocab = tok.get_vocab(with_added_tokens=True)
    table = np.zeros(max(vocab.values()) + 1, dtype=bool)
    tokens = vocab.items()  # ids are unique: no need to sort
    model = tok.model  # the model object's attributes: no JSON round trip of the whole tokenizer
    if type(model).__name__ == "WordPiece":
        prefix = getattr(model, "continuing_subword_prefix", None) or "##"
        flags = [t.startswith(prefix) and len(t) > len(prefix) for t, _ in tokens]
    else:
        starts = ("Ġ", "▁")
        flags = [not t.startswith(starts) and not (t.startswith("<") and t.endswith(">")) for t, _ in tokens]
    table[np.fromiter((i for _, i in tokens), dtype=np.int64, count=len(tokens))] = flags
    return table


# The ASCII bytes BertNormalizer keeps as they are (up to case): printable ones, and \t \n \r
# (made spaces, which the BERT pre-tokenizer splits on anyway). It deletes the other controls.
_PLAIN_ASCII = bytes(range(0x20, 0x7F)) + b"\t\n\r"


class _AsciiPath:
    """BertNormalizer's work done in Python for plain-ASCII texts, then a tokenizer without it.

    For ASCII text, ``BertNormalizer`` only deletes control characters and lower-cases (its
    accent stripping, NFD and CJK spacing change nothing), yet its alignment-tracking Rust code
    takes about a third of the tokenizer's time on English text. So texts that are ASCII
    (``str.isascii`` is O(1) in CPython), contain no control character and no added-token
    string (those are matched before normalisation; the check is case-insensitive, to be safe
    both ways) are lower-cased by ``str.lower`` and sent to a copy of the tokenizer whose
    normaliser is removed; every other text goes through the full tokenizer. The ids are
    identical either way (``tests/test_tokenize.py`` compares them on the sample corpora and on
    generated text); only offsets would differ, and the pipeline reads ids only.
    """

    def __init__(self, tok: Tokenizer, normalizer: normalizers.BertNormalizer):
        self.tokenizer = Tokenizer.from_str(tok.to_str())
        self.tokenizer.normalizer = None
        self.lowercase = bool(normalizer.lowercase)
        added = sorted({t.content.lower().encode() for t in tok.get_added_tokens_decoder().values() if t.content})
        # searched in lower-cased bytes (a literal alternation: ~50x faster than IGNORECASE)
        self._added = re.compile(b"|".join(map(re.escape, added))) if added else None

    def _unsafe(self, data: bytes) -> bool:
        """Whether ASCII ``data`` holds a control character or an added token's string."""
        if data.translate(None, _PLAIN_ASCII):
            return True
        return self._added is not None and self._added.search(data.lower()) is not None

    @classmethod
    def for_tokenizer(cls, tok: Tokenizer) -> "_AsciiPath | None":
        norm = tok.normalizer
        return cls(tok, norm) if isinstance(norm, normalizers.BertNormalizer) else None

    def split(self, texts: list[str]) -> tuple[list[int], list[str]]:
        """Indices of the texts this path takes, and those texts normalised."""
        take = [i for i, t in enumerate(texts) if t.isascii()]
        if not take:
            return [], []
        chosen = [texts[i] for i in take]
        if self._unsafe("\n".join(chosen).encode("ascii")):  # rare: sort it out text by text
            keep = [k for k, t in enumerate(chosen) if not self._unsafe(t.encode("ascii"))]
            take = [take[k] for k in keep]
            chosen = [chosen[k] for k in keep]
        if self.lowercase:
            chosen = [t.lower() for t in chosen]
        return take, chosen


@dataclass(frozen=True)
class SpecialIds:
    cls: int
    sep: int
    mask: int
    pad: int


class TextTokenizer:
    """A loaded tokenizer plus what instance building and masking need from it."""

    def __init__(self, path: str, *, do_lower_case: bool = True):
        tok, kind = _resolve(path, do_lower_case)
        tok.no_truncation()
        tok.no_padding()
        self.path = path
        self.kind = kind
        self.do_lower_case = do_lower_case
        self.tokenizer = tok
        ids = {}
        for role, names in _SPECIALS.items():
            for name in names:
                tid = tok.token_to_id(name)
                if tid is not None:
                    ids[role] = tid
                    break
        missing = [r for r in ("cls", "sep", "mask") if r not in ids]
        if missing:
            raise TokenizerError(
                f"tokenizer {path} has no token for {', '.join(missing)} "
                f"(looked for {', '.join(n for r in missing for n in _SPECIALS[r])})"
            )
        self.special = SpecialIds(cls=ids["cls"], sep=ids["sep"], mask=ids["mask"], pad=ids.get("pad", 0))
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.is_continuation = _continuation_table(tok)
        self.special_id_array = np.array(sorted(set(ids.values())), dtype=np.int32)
        self._ascii = _AsciiPath.for_tokenizer(tok)

    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 of the serialised tokenizer (vocab, normaliser, lower-casing...)."""
        return hashlib.sha256(self.tokenizer.to_str().encode("utf-8")).hexdigest()

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of many texts as one flat int32 array plus per-text lengths.

        Plain-ASCII texts take a faster, identical route when the tokenizer normalises with
        ``BertNormalizer`` (see ``_AsciiPath``); the two results are put back in text order.
        """
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        if self._ascii is None:
            return encode_ids(self.tokenizer, texts)
        take, normalised = self._ascii.split(texts)
        if len(take) == len(texts):
            return encode_ids(self._ascii.tokenizer, normalised)
        if not take:
            return encode_ids(self.tokenizer, texts)
        fast = np.zeros(len(texts), bool)
        fast[take] = True
        rest = np.flatnonzero(~fast)
        parts = [
            (fast, encode_ids(self._ascii.tokenizer, normalised)),
            (~fast, encode_ids(self.tokenizer, [texts[i] for i in rest.tolist()])),
        ]
        lengths = np.empty(len(texts), np.int64)
        for where, (_, lens) in parts:
            lengths[where] = lens
        starts = np.cumsum(lengths) - lengths
        ids = np.empty(int(lengths.sum()), np.int32)
        for where, (part_ids, lens) in parts:
            part_starts = np.cumsum(lens) - lens
            ids[np.arange(len(part_ids)) + np.repeat(starts[where] - part_starts, lens)] = part_ids
        return ids, lengths

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.tokenizer.id_to_token(int(i)) or f"<{int(i)}>" for i in ids]


def encode_ids(tokenizer: Tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Ids of ``texts`` (no special tokens added) as one flat int32 array plus per-text lengths.

    One Rust call per ``ENCODE_BATCH`` texts; the only Python work is one ``.ids`` read per
    text. Sub-batches keep the ``Encoding`` objects alive at once (tokens, offsets, masks: about
    100 bytes per token) to a few MB instead of ~100 MB for a 4 MB block, at no cost in speed.
    """
    encode = tokenizer.encode_batch_fast
    ids = operator.attrgetter("ids")
    flats, lengths = [], []
    for start in range(0, len(texts), ENCODE_BATCH):
        encodings = encode(texts[start : start + ENCODE_BATCH], add_special_tokens=False)
        lens = np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings))
        # each text's id list is consumed as soon as it is made (a quarter faster than
        # collecting the lists first)
        flat = np.fromiter(itertools.chain.from_iterable(map(ids, encodings)), dtype=np.int32, count=int(lens.sum()))
        flats.append(flat)
        lengths.append(lens)
    if len(flats) == 1:
        return flats[0], lengths[0]
    return np.concatenate(flats), np.concatenate(lengths)


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str, do_lower_case: bool = True) -> TextTokenizer:
    """Per-process cache: each worker loads the tokenizer once, never pickled from the parent."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return TextTokenizer(path, do_lower_case=do_lower_case)
