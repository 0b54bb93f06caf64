"""ALBERT's tokenization rules for a SentencePiece model, as google-research/albert's ``tokenization.py``.

ALBERT's ``create_pretraining_data.py`` with ``--spm_model_file`` prepares each line with
``preprocess_text`` (whitespace runs to one space, NFKD, combining marks dropped, lower-cased),
splits it with the model (``encode_pieces``) and looks each piece up (``PieceToId``). Its masking
groups pieces into words by ``_is_start_piece_sp``, a test on the piece's text, not on the
model's ``▁`` alone. The functions here follow those rules; the ``sentencepiece`` library is the
model's own encoder (its normaliser, dummy prefix and unknown pieces are the model's).

A piece's *kind* (:data:`CONTINUATION`, :data:`START`, :data:`SPECIAL`) is what ALBERT's masking
reads from it: a start piece opens a word (``token_boundary`` 1), a continuation joins the word
before it, and a piece spelled ``[CLS]`` or ``[SEP]`` is never a masking candidate.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Sequence

import numpy as np

from mlm_pipeline.errors import TokenizerError

UNDERLINE = "\u2581"  # SentencePiece's word-start marker
CONTINUATION, START, SPECIAL = 0, 1, 2

# ``_is_start_piece_sp``'s punctuation: these 28 characters (no ', <, =, >). Upstream adds the
# UTF-8 bytes of € and £, which never equal a piece (a str), so they change nothing.
_START_PUNCTUATION = frozenset('!"#$%&()*+,-./:;?@[\\]^_`{|}~')
_WORD_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz") | _START_PUNCTUATION
SPECIAL_PIECES = ("[CLS]", "[SEP]")  # the masking never takes a token spelled so


def preprocess_text(text: str, lower: bool = True) -> str:
    """ALBERT's ``preprocess_text`` (``remove_space=True``): whitespace runs (Python's idea) to one
    space, stripped; NFKD; characters with a canonical combining class dropped; ``str.lower()``.

    There is no strip after NFKD: ``"¨"`` becomes ``" "`` (a space and a dropped mark), which is
    not blank, while a line of combining marks only becomes ``""``.
    """
    out = unicodedata.normalize("NFKD", " ".join(text.strip().split()))
    out = "".join(c for c in out if not unicodedata.combining(c))
    return out.lower() if lower else out


def is_start_piece(piece: str) -> bool:
    """ALBERT's ``_is_start_piece_sp``: a piece starts a word if it starts with ``▁`` or ``<``, or
    holds a character whose lower case is neither an ASCII letter nor one of the 28 punctuation
    marks (digits, CJK, ``'``, ``=``, ``–``...). So an unprefixed piece of ASCII letters and those
    marks continues the word before it."""
    if piece.startswith((UNDERLINE, "<")) or piece in _START_PUNCTUATION:
        return True
    return not all(c.lower() in _WORD_CHARACTERS for c in piece)


def piece_kind(piece: str) -> int:
    """:data:`SPECIAL` for ``[CLS]``/``[SEP]``, else :data:`START` or :data:`CONTINUATION`."""
    if piece in SPECIAL_PIECES:
        return SPECIAL
    return START if is_start_piece(piece) else CONTINUATION


def wordpiece_kind(token: str) -> int:
    """The same for a WordPiece token (``_is_start_piece_bert``: not ``##``-prefixed)."""
    if token in SPECIAL_PIECES:
        return SPECIAL
    return CONTINUATION if token.startswith("##") else START


def kind_table(tokens: Sequence[str], wordpiece: bool) -> np.ndarray:
    """Per vocabulary id (``tokens`` in id order), its piece kind (uint8)."""
    kind = wordpiece_kind if wordpiece else piece_kind
    return np.fromiter((kind(t) for t in tokens), dtype=np.uint8, count=len(tokens))


def _split_digit_comma(piece: str) -> bool:
    return len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit()


class AlbertSentencePiece:
    """A SentencePiece model with ALBERT's ``encode_pieces`` and ``PieceToId``.

    :meth:`encode` tokenizes prepared lines in one batched call of the library, then maps each
    piece, once per distinct piece, to its id and kind: a piece ending in a digit and ``,`` is
    re-encoded without its ``▁`` and followed by ``","`` (ALBERT's digit-comma rule; the ``▁``
    that re-encoding puts in front stays, as upstream's test that meant to drop it compares a
    ``str`` with ``bytes``); any other piece is ``PieceToId(piece)`` (the unknown id for a piece of
    unknown surface text), its kind read from its text.
    """

    def __init__(self, model_file: str, *, lower: bool = True):
        import sentencepiece as spm

        path = Path(model_file)
        if not path.is_file():
            raise TokenizerError(f"SentencePiece model not found: {model_file}")
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as exc:
            raise TokenizerError(f"cannot load SentencePiece model {model_file}: {exc}") from exc
        self.path = str(path)
        self.lower = lower
        self.vocab_size = self.sp.GetPieceSize()
        self.cls_id, self.sep_id, self.mask_id = (self.sp.PieceToId(p) for p in ("[CLS]", "[SEP]", "[MASK]"))
        self._codes: dict[str, int] = {}  # piece -> id * 4 + kind, or -(1 + index in _split)
        self._split: list[tuple[np.ndarray, np.ndarray]] = []

    def prepare(self, line: str) -> str:
        return preprocess_text(line, self.lower)

    def _code(self, piece: str) -> int:
        code = self._codes.get(piece)
        if code is None:
            if _split_digit_comma(piece):
                pieces = [*self.sp.EncodeAsPieces(piece[:-1].replace(UNDERLINE, "")), ","]
                self._split.append((np.array([self.sp.PieceToId(p) for p in pieces], np.int32),
                                    np.array([piece_kind(p) for p in pieces], np.uint8)))
                code = -len(self._split)
            else:
                code = self.sp.PieceToId(piece) * 4 + piece_kind(piece)
            self._codes[piece] = code
        return code

    def encode(self, lines: list[str], where: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids int32, kinds uint8, per-line lengths int64) of prepared lines, flat (``where``, the
        input's name, is for messages; the library encodes every text)."""
        if not lines:
            return np.zeros(0, np.int32), np.zeros(0, np.uint8), np.zeros(0, np.int64)
        pieces = self.sp.encode(lines, out_type=str)
        codes_get, code = self._codes.get, self._code
        flat = [c if (c := codes_get(p)) is not None else code(p) for line in pieces for p in line]
        lengths = np.fromiter(map(len, pieces), np.int64, len(pieces))
        codes = np.array(flat, np.int64)
        if len(codes) and int(codes.min()) < 0:  # the digit-comma rule fired: expand those pieces
            return self._expand(codes, lengths)
        return (codes >> 2).astype(np.int32), (codes & 3).astype(np.uint8), lengths

    def _expand(self, codes: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids, kinds = [], []
        line = np.repeat(np.arange(len(lengths)), lengths)
        new_lengths = np.zeros(len(lengths), np.int64)
        for c, l in zip(codes.tolist(), line.tolist()):
            if c >= 0:
                ids.append(np.array([c >> 2], np.int32))
                kinds.append(np.array([c & 3], np.uint8))
                new_lengths[l] += 1
            else:
                i, k = self._split[-c - 1]
                ids.append(i)
                kinds.append(k)
                new_lengths[l] += len(i)
        return np.concatenate(ids), np.concatenate(kinds), new_lengths
