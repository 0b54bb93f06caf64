"""Google's ``FullTokenizer`` rules, BERT's and ELECTRA's, as an HF tokenizer over a WordPiece vocab.

google-research/bert's ``tokenization.py`` and google-research/electra's copy of it test each
character with Python's ``unicodedata``, while HF's ``BertNormalizer``/``BertPreTokenizer`` carry
their own, older Unicode tables: on some 760 assigned characters (marks, punctuation and format
characters of recent Unicode versions, the last CJK extension) and on private-use characters the
two tokenize differently. This module spells each of Google's character classes out as an
explicit code-point class built from ``unicodedata``. Two steps remain HF's unless the text comes
lower-cased and in NFD by Python (``normalized_in_python``): lower-casing (Rust's case mappings,
of a newer Unicode than Python 3.11's: 55 capitals Python does not know) and NFD (older canonical
combining classes, which order some runs of marks otherwise). ``--reference`` uses it that way for
the sentences HF's tables would split otherwise (:class:`GoogleRulesRouter`). The ``electra``
flavor uses HF's two steps: ELECTRA's cleaning deletes the characters Python leaves unassigned,
those capitals among them, and a text holding a spacing mark with a combining class is put in NFD
by Python first (:func:`electra_in_python`).
"""

from __future__ import annotations

import functools
import itertools
import re
import unicodedata
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from mlm_pipeline.errors import TokenizerError

# Google's tokenizer: clean the text (delete some characters, turn whitespace into spaces), put
# spaces around CJK ideographs, split on whitespace, and per word (when lower-casing) lower-case,
# NFD, drop non-spacing marks, then split off each punctuation character. BERT's cleaning deletes
# NUL, U+FFFD and the categories Cc and Cf except ``\t \n \r``; ELECTRA's deletes every category
# starting with ``C`` (control, format, unassigned, private use). As HF steps:
#
#   normalizer:    delete [cleaning's class, U+FFFD] -> [\t\n\r Zs] to " " -> (when lower-casing)
#                  Lowercase -> NFD -> delete [Mn]
#   pre-tokenizer: split on whitespace, then isolate each [ASCII punctuation, P*, CJK ideograph]
#   model:         WordPiece, "##" continuations, [UNK] for words over 200 code points
#
# Equal to Google's order (clean, space CJK, split, lower, strip accents, split punctuation):
# lower-casing and NFD never turn a character into or out of a CJK ideograph, and never create
# whitespace or a ``C`` character (checked over all of Unicode in the tests). Two places where
# HF's own tables differ from Python's are patched: NFD of U+11938 (Python's Unicode 14
# decomposes it, HF does not) is done by an explicit replacement, and a text holding a capital
# sigma, which Python lower-cases by context (``ς`` at a word end), or a mark NFD orders by
# class is lower-cased (and put in NFD) by Python before the tokenizer sees it
# (:func:`google_lower`, :func:`google_normalized`, :func:`electra_in_python`).
# Special tokens are not matched in the raw text (Google's tokenizer splits ``[SEP]`` like any
# text).

GOOGLE_MAX_INPUT_CHARS_PER_WORD = 200  # Google's WordPiece limit (HF's default is 100)
CLEANINGS = ("bert", "electra")  # which characters Google's text cleaning deletes
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


@functools.lru_cache(maxsize=2)
def google_char_classes(cleaning: str = "electra") -> dict[str, list[tuple[int, int]]]:
    """Code-point runs of the classes Google's tokenizer tests, from Python's ``unicodedata``.

    ``delete``: what ``cleaning`` (``"bert"``: Cc and Cf; ``"electra"``: every ``C*``) deletes,
    except ``\\t \\n \\r``, plus U+0000 and U+FFFD (surrogates left out: no UTF-8 text holds
    them); ``space``: ``\\t \\n \\r``, space and ``Zs``; ``mark``: ``Mn``; ``isolate``: ASCII
    punctuation, ``P*`` and CJK ideographs.
    """
    if cleaning not in CLEANINGS:
        raise ValueError(f"unknown cleaning {cleaning!r}")
    cats = np.frombuffer("".join(unicodedata.category(chr(cp)) for cp in range(0x110000)).encode("ascii"), "S2")
    major = cats.view("S1")[::2]
    delete = major == b"C" if cleaning == "electra" else (cats == b"Cc") | (cats == b"Cf")
    delete[[9, 10, 13]] = False
    delete[0xD800:0xE000] = False
    delete[[0, 0xFFFD]] = True
    space = cats == b"Zs"
    space[[9, 10, 13, 32]] = True
    mark = cats == b"Mn"
    isolate = major == b"P"
    for lo, hi in _ASCII_PUNCTUATION + _CJK_RANGES:
        isolate[lo : hi + 1] = True
    return {"delete": _ranges(delete), "space": _ranges(space), "mark": _ranges(mark), "isolate": _ranges(isolate)}


def _onig_class(runs: list[tuple[int, int]]) -> str:
    return "[" + "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in runs) + "]"


@functools.lru_cache(maxsize=2)
def _deletions(cleaning: str) -> re.Pattern:
    runs = google_char_classes(cleaning)["delete"]
    return re.compile("[" + "".join(re.escape(chr(a)) + ("" if a == b else "-" + re.escape(chr(b))) for a, b in runs) + "]+")


def google_lower(text: str, cleaning: str) -> str:
    """Google's cleaning (its deletions) then Python's ``str.lower``, for texts whose lower-casing
    needs context (a final capital sigma is ``ς``; HF's per-character lower-casing gives ``σ``).

    The deleted characters go first because they change what counts as word-final. Lower-casing
    the whole cleaned text equals Google's word-by-word lower-casing: whitespace is neither cased
    nor case-ignorable, so it bounds a final-sigma context just like a word end.
    """
    return _deletions(cleaning).sub("", text).lower()


@functools.lru_cache(maxsize=1)
def _needs_python() -> re.Pattern:
    """A capital sigma (lower-cased by context), or a mark that accent stripping keeps and NFD
    orders by a combining class (25 spacing marks in Unicode 14; HF's older tables give some of
    them, or the marks between them, no class)."""
    # marks live in planes 0, 1 and 14 (2 and 3 hold ideographs, 15 and 16 private use); the
    # tests check every code point
    planes = itertools.chain(range(0xD800), range(0xE000, 0x20000), range(0xE0000, 0xF0000))
    marks = [chr(cp) for cp in planes if unicodedata.combining(chr(cp)) and unicodedata.category(chr(cp)) != "Mn"]
    return re.compile("[" + "".join(map(re.escape, [CAPITAL_SIGMA, *marks])) + "]")


def electra_in_python(text: str, strip_accents: bool = True) -> str:
    """A text as the ``electra`` flavor's HF steps must get it when lower-casing: one holding a
    capital sigma or a mark NFD orders by class (:func:`_needs_python`) cleaned, lower-cased and
    put in NFD by Python, as ELECTRA's tokenizer does (HF's steps then change nothing of that);
    any other text unchanged. Without accent stripping (ELECTRA's ``--no-strip-accents``) there is
    no NFD: only a capital sigma needs Python's lower-casing."""
    if text.isascii():
        return text
    if not strip_accents:
        return google_lower(text, "electra") if CAPITAL_SIGMA in text else text
    if _needs_python().search(text):
        return google_normalized(text, "electra")
    return text


def google_normalized(text: str, cleaning: str) -> str:
    """Google's cleaning (deletions only), lower-casing and NFD, all by Python's tables, for the
    tokenizer built with ``normalized_in_python``. On the whole text, as on each word: whitespace
    neither is cased nor combines, so it bounds a final sigma and canonical reordering alike."""
    return unicodedata.normalize("NFD", google_lower(text, cleaning))


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


def google_rules_tokenizer(
    vocab: dict[str, int], lowercase: bool, cleaning: str, *, unk_token: str = "[UNK]", prefix: str = "##",
    normalized_in_python: bool = False, strip_accents: bool = True,
) -> Tokenizer:
    """An HF tokenizer applying Google's ``FullTokenizer`` rules (``cleaning``: BERT's or
    ELECTRA's) to a WordPiece ``vocab``.

    Accents are stripped when lower-casing (as Google's tokenizer does), unless ``strip_accents``
    is False (ELECTRA's ``--no-strip-accents``: lower-casing alone). Capital sigmas must be
    lower-cased before (see above). ``normalized_in_python``: texts come lower-cased and in NFD by
    Python's tables (:func:`google_normalized`), so HF's own (Rust's newer case mappings, older
    canonical combining classes) do not take part.
    """
    classes = google_char_classes(cleaning)
    steps = [
        normalizers.Replace(Regex(_onig_class(classes["delete"])), ""),
        normalizers.Replace(Regex(_onig_class(classes["space"])), " "),
    ]
    strip = lowercase and strip_accents
    if lowercase and not normalized_in_python:
        steps.append(normalizers.Lowercase())
    if strip and not normalized_in_python:
        steps += [normalizers.Replace(c, unicodedata.normalize("NFD", c)) for c in _NFD_PATCHES]
        steps.append(normalizers.NFD())
    if strip:
        steps.append(normalizers.Replace(Regex(_onig_class(classes["mark"])), ""))
    tok = Tokenizer(
        models.WordPiece(
            vocab=dict(vocab), unk_token=unk_token, continuing_subword_prefix=prefix,
            max_input_chars_per_word=GOOGLE_MAX_INPUT_CHARS_PER_WORD,
        )
    )
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(_onig_class(classes["isolate"])), "isolated")]
    )
    tok.decoder = decoders.WordPiece(prefix=prefix)
    return tok


def electra_tokenizer(vocab: dict[str, int], lowercase: bool, strip_accents: bool = True) -> Tokenizer:
    """The ``electra`` flavor: ELECTRA's ``FullTokenizer`` rules over a WordPiece ``vocab``
    (``strip_accents``: its ``--do-strip-accents``/``--no-strip-accents``, when lower-casing)."""
    if "[UNK]" not in vocab:
        raise TokenizerError("tokenizer flavor 'electra' needs a vocabulary with [UNK]")
    return google_rules_tokenizer(vocab, lowercase, "electra", strip_accents=strip_accents)


def google_rules_of(spec: dict) -> tuple[dict[str, int], bool, str, str] | None:
    """``(vocab, lowercase, unk_token, prefix)`` when a serialised HF tokenizer (``to_str``'s JSON)
    is Google's BERT tokenizer as HF writes it: ``BertNormalizer`` cleaning text and spacing CJK,
    stripping accents exactly when lower-casing, ``BertPreTokenizer`` and WordPiece. None for any
    other tokenizer: Google's rules say nothing about it."""
    norm, pre, model = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    if norm.get("type") != "BertNormalizer" or pre.get("type") != "BertPreTokenizer" or model.get("type") != "WordPiece":
        return None
    lowercase = bool(norm.get("lowercase"))
    if not (norm.get("clean_text") and norm.get("handle_chinese_chars")) or norm.get("strip_accents") not in (None, lowercase):
        return None
    return dict(model["vocab"]), lowercase, model.get("unk_token", "[UNK]"), model.get("continuing_subword_prefix", "##")


def _bert_cleaned(ch: str) -> str:
    """What Google BERT's text cleaning and CJK spacing make of one character."""
    cat = unicodedata.category(ch)
    if ch in "\t\n\r " or cat == "Zs":
        return " "
    if ch in "\x00\ufffd" or cat in ("Cc", "Cf"):
        return ""
    if any(lo <= ord(ch) <= hi for lo, hi in _CJK_RANGES):
        return f" {ch} "
    return ch


def _google_isolates(ch: str) -> bool:
    return any(lo <= ord(ch) <= hi for lo, hi in _ASCII_PUNCTUATION) or unicodedata.category(ch)[0] == "P"


def bert_words(text: str, lowercase: bool) -> list[str]:
    """Google BERT's ``BasicTokenizer`` in plain Python, a character at a time: the words
    WordPiece gets (slow; the router below runs it on one probe per character)."""
    words = []
    for word in "".join(map(_bert_cleaned, text)).split():
        if lowercase:
            word = "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")
        start = 0
        for i, ch in enumerate(word):
            if _google_isolates(ch):
                words += [word[start:i], ch] if i > start else [ch]
                start = i + 1
        if start < len(word):
            words.append(word[start:])
    return words


def _may_reorder(ch: str) -> bool:
    """Whether NFD may order ``ch`` among its neighbours otherwise by HF's tables than by Python's.

    Only marks that survive accent stripping can show an order (a non-spacing mark is dropped
    after NFD): those with a combining class, which Python's tables and HF's older ones may give
    differently, and characters Python's tables leave unassigned, which HF's may know as marks."""
    cat = unicodedata.category(ch)
    return cat == "Cn" or (cat != "Mn" and unicodedata.combining(ch) != 0)


class GoogleRulesRouter:
    """Finds the texts that an HF BERT tokenizer splits otherwise than Google's tokenizer, and
    encodes those by Google's rules with Python's tables.

    The two tokenize a character alike or not whatever surrounds it, with two exceptions: a final
    capital sigma (lower-cased by Python before either sees the text) and the order NFD gives a
    run of combining marks when lower-casing. So a text is routed when it holds a character the
    two split differently, learnt once per character when a text first holds it (HF splits
    ``a<c>b <c>``, many probes in one call, and :func:`bert_words` splits it in Python), or, when
    lower-casing, one whose canonical reordering may differ (:func:`_may_reorder`). Routed texts
    are cleaned, lower-cased and put in NFD by Python (:func:`google_normalized`). Texts of ASCII
    only are never routed (the tables agree on ASCII, checked when the router is built). The
    tokenizer that encodes routed texts is built when the first one comes (about 0.2 s).
    """

    _SEPARATOR = "|"  # ASCII punctuation: its own word in both, and no other character normalizes to it
    _CHUNK = 1 << 16  # texts scanned at once: bounds the code-point arrays
    _ENCODE_CHUNK = 4096  # texts encoded at once: HF's encodings of a call are all held until it returns

    def __init__(self, hf: Tokenizer, vocab: dict[str, int], lowercase: bool, unk_token: str, prefix: str):
        self.hf = hf
        self._google_args = (vocab, lowercase, "bert")
        self._google_kwargs = {"unk_token": unk_token, "prefix": prefix, "normalized_in_python": True}
        self.lowercase = lowercase
        self.known = np.zeros(0x110000, dtype=bool)
        self.differs = np.zeros(0x110000, dtype=bool)
        self.known[ord(self._SEPARATOR)] = True
        self.known[0xD800:0xE000] = True  # surrogates: no text decoded from UTF-8 holds them
        self._learn(np.flatnonzero(~self.known[:128]))
        if self.differs[:128].any():
            raise TokenizerError("the HF tokenizer splits ASCII otherwise than Google's rules")

    @functools.cached_property
    def google(self) -> Tokenizer:
        tok = google_rules_tokenizer(*self._google_args, **self._google_kwargs)
        tok.no_truncation()
        tok.no_padding()
        return tok

    def _hf_words(self, chars: list[str]) -> list[list[str]] | None:
        text = f" {self._SEPARATOR} ".join(f"a{c}b {c}" for c in chars)
        groups: list[list[str]] = [[]]
        for word, _ in self.hf.pre_tokenizer.pre_tokenize_str(self.hf.normalizer.normalize_str(text)):
            if word == self._SEPARATOR:
                groups.append([])
            else:
                groups[-1].append(word)
        return groups if len(groups) == len(chars) else None

    def _learn(self, code_points: np.ndarray) -> None:
        for start in range(0, len(code_points), 8192):
            cps = code_points[start : start + 8192]
            chars = [chr(c) for c in cps]
            hf = self._hf_words(chars)
            if hf is None:  # a probe made a separator: one at a time, and None routes
                hf = [(self._hf_words([c]) or [None])[0] for c in chars]
            self.differs[cps] = [w != bert_words(f"a{c}b {c}", self.lowercase) or (self.lowercase and _may_reorder(c))
                                 for c, w in zip(chars, hf)]
            self.known[cps] = True

    def routed(self, texts: list[str]) -> list[int]:
        """Indices of the texts that HF's tables would split otherwise than Google's."""
        candidates = [i for i, t in enumerate(texts) if not t.isascii()]
        out: list[int] = []
        for start in range(0, len(candidates), self._CHUNK):
            chunk = candidates[start : start + self._CHUNK]
            held = [texts[i] for i in chunk]  # none is empty: each holds a non-ASCII character
            cps = np.frombuffer("".join(held).encode("utf-32-le", "surrogatepass"), np.uint32)
            if len(new := np.unique(cps[~self.known[cps]])):
                self._learn(new)
            lengths = np.fromiter(map(len, held), np.int64, len(held))
            hits = np.logical_or.reduceat(self.differs[cps], np.cumsum(lengths) - lengths)
            out += [chunk[k] for k in np.flatnonzero(hits)]
        return out

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's ids (int32) by Google's rules with Python's tables (no special tokens)."""
        out: list[np.ndarray] = []
        for start in range(0, len(texts), self._ENCODE_CHUNK):
            chunk = texts[start : start + self._ENCODE_CHUNK]
            if self.lowercase:
                chunk = [google_normalized(t, "bert") for t in chunk]
            out += [np.asarray(e.ids, dtype=np.int32) for e in self.google.encode_batch(chunk, add_special_tokens=False)]
        return out
