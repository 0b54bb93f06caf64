"""ELECTRA's tokenizer rules over a WordPiece vocabulary (the ``electra`` flavor).

google-research/electra's ``model/tokenization.py`` is Google BERT's tokenizer with two changes:
its text cleaning deletes every character whose Unicode category starts with ``C`` (control,
format, unassigned, private use, surrogate; BERT deletes only Cc/Cf) except ``\t \n \r``, and it
strips accents only when it lower-cases. The details are in the comment below.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from mlm_pipeline.errors import TokenizerError

# google-research/electra's ``model/tokenization.py`` is Google BERT's tokenizer with two changes:
# its text cleaning deletes every character whose Unicode category starts with ``C`` (control,
# format, unassigned, private use, surrogate; BERT deletes only Cc/Cf) except ``\t \n \r``, and it
# strips accents only when it lower-cases. Its character tests use Python's ``unicodedata``, while
# HF's ``BertNormalizer``/``BertPreTokenizer`` carry their own (older) Unicode tables, so the
# flavor spells every class out as an explicit code-point class built from ``unicodedata``:
#
#   normalizer:    delete [C* but \t\n\r, U+FFFD] -> [\t\n\r Zs] to " " -> (when lower-casing)
#                  Lowercase -> NFD -> delete [Mn]
#   pre-tokenizer: split on whitespace, then isolate each [ASCII punctuation, P*, CJK ideograph]
#   model:         WordPiece, "##" continuations, [UNK] for words over 200 code points
#
# Equal to Google's order (clean, space CJK, split, lower, strip accents, split punctuation):
# lower-casing and NFD never turn a character into or out of a CJK ideograph, and never create
# whitespace or a ``C`` character (checked over all of Unicode in the tests). Two places where
# HF's own tables differ from Python's are patched: NFD of U+11938 (Python's Unicode 14
# decomposes it, HF does not) is done by an explicit replacement, and a capital sigma, which
# Python lower-cases by context (``ς`` at a word end), is lower-cased in Python before the
# tokenizer sees the text (``TextTokenizer.encode_batch``). Special tokens are not matched in
# the raw text (Google's tokenizer splits ``[SEP]`` like any text).

ELECTRA_MAX_INPUT_CHARS_PER_WORD = 200
TOKENIZER_FLAVORS = ("bert", "electra")

# CJK ideograph ranges of Google's ``_is_chinese_char`` (HF's table starts the last
# extension at U+2B920, Google's at U+2B820).
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)
_ASCII_PUNCTUATION = ((33, 47), (58, 64), (91, 96), (123, 126))
_NFD_PATCHES = ("\U00011938",)  # decomposed by Python's NFD, not by HF's
CAPITAL_SIGMA = "\u03a3"


def _ranges(flags: np.ndarray) -> list[tuple[int, int]]:
    """Inclusive (first, last) code-point runs where ``flags`` is true."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], flags.view(np.int8), [0]))))
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2])]


@functools.lru_cache(maxsize=1)
def electra_char_classes() -> dict[str, list[tuple[int, int]]]:
    """Code-point runs of the classes ELECTRA's tokenizer tests, from Python's ``unicodedata``.

    ``delete``: category ``C*`` except ``\\t \\n \\r``, plus U+0000 and U+FFFD (surrogates left
    out: no UTF-8 text holds them); ``space``: ``\\t \\n \\r``, space and ``Zs``; ``mark``: ``Mn``;
    ``isolate``: ASCII punctuation, ``P*`` and CJK ideographs.
    """
    cats = [unicodedata.category(chr(cp)) for cp in range(0x110000)]
    major = np.frombuffer("".join(c[0] for c in cats).encode("ascii"), dtype="S1")
    delete = major == b"C"
    delete[[9, 10, 13]] = False
    delete[0xD800:0xE000] = False
    delete[0xFFFD] = True
    space = np.fromiter((c == "Zs" for c in cats), dtype=bool, count=len(cats))
    space[[9, 10, 13, 32]] = True
    mark = np.fromiter((c == "Mn" for c in cats), dtype=bool, count=len(cats))
    isolate = major == b"P"
    for lo, hi in _ASCII_PUNCTUATION + _CJK_RANGES:
        isolate[lo : hi + 1] = True
    return {"delete": _ranges(delete), "space": _ranges(space), "mark": _ranges(mark), "isolate": _ranges(isolate)}


def _onig_class(runs: list[tuple[int, int]]) -> str:
    return "[" + "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in runs) + "]"


@functools.lru_cache(maxsize=1)
def _electra_deletions() -> re.Pattern:
    runs = electra_char_classes()["delete"]
    return re.compile("[" + "".join(re.escape(chr(a)) + ("" if a == b else "-" + re.escape(chr(b))) for a, b in runs) + "]+")


def electra_lower(text: str) -> str:
    """ELECTRA's cleaning then Python's ``str.lower`` (for texts whose lower-casing needs context).

    Lower-casing the whole cleaned text equals Google's word-by-word lower-casing: whitespace is
    neither cased nor case-ignorable, so it bounds a final-sigma context just like a word end.
    """
    return _electra_deletions().sub("", text).lower()


def read_google_vocab(path: str) -> dict[str, int]:
    """A ``vocab.txt`` read like Google's ``load_vocab``: line i, ``str.strip()``ped, has id i
    (a repeated token keeps its last id)."""
    try:
        text = Path(path).read_bytes().decode("utf-8", "ignore")
    except OSError as exc:
        raise TokenizerError(f"cannot read WordPiece vocab {path}: {exc}") from exc
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # a final newline ends the last line; it starts no empty one
    vocab = {line.strip(): i for i, line in enumerate(lines)}
    if not vocab:
        raise TokenizerError(f"WordPiece vocab {path} is empty")
    return vocab


def electra_tokenizer(vocab: dict[str, int], lowercase: bool) -> Tokenizer:
    """An HF tokenizer applying ELECTRA's ``FullTokenizer`` rules to a WordPiece ``vocab``.

    Accents are stripped exactly when lower-casing (ELECTRA's default ``strip_accents=True``
    takes effect only then). Capital sigmas are handled by ``TextTokenizer`` (see above).
    """
    if "[UNK]" not in vocab:
        raise TokenizerError("tokenizer flavor 'electra' needs a vocabulary with [UNK]")
    classes = electra_char_classes()
    steps = [
        normalizers.Replace(Regex(_onig_class(classes["delete"])), ""),
        normalizers.Replace(Regex(_onig_class(classes["space"])), " "),
    ]
    if lowercase:
        steps.append(normalizers.Lowercase())
        steps += [normalizers.Replace(c, unicodedata.normalize("NFD", c)) for c in _NFD_PATCHES]
        steps += [normalizers.NFD(), normalizers.Replace(Regex(_onig_class(classes["mark"])), "")]
    tok = Tokenizer(
        models.WordPiece(
            vocab=dict(vocab), unk_token="[UNK]", max_input_chars_per_word=ELECTRA_MAX_INPUT_CHARS_PER_WORD
        )
    )
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(_onig_class(classes["isolate"])), "isolated")]
    )
    tok.decoder = decoders.WordPiece()
    return tok
