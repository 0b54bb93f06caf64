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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
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

    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 of the serialised tokenizer (vocab, normaliser, lower-casing...)."""
        return hashlib.sha256(self.tokenizer.to_str().encode("utf-8")).hexdigest()

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of many texts as one flat int32 array plus per-text lengths.

        One Rust call per ``ENCODE_BATCH`` texts; the only Python work is one ``.ids`` read per
        text. Sub-batches keep the ``Encoding`` objects alive at once (tokens, offsets, masks: about
        100 bytes per token) to a few MB instead of ~100 MB for a 4 MB block, at no cost in speed.
        """
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        encode = self.tokenizer.encode_batch_fast
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

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.tokenizer.id_to_token(int(i)) or f"<{int(i)}>" for i in ids]


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str, do_lower_case: bool = True) -> TextTokenizer:
    """Per-process cache: each worker loads the tokenizer once, never pickled from the parent."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return TextTokenizer(path, do_lower_case=do_lower_case)
