"""The masking contract: what every scheme gets, returns and declares, and the helpers they share.

A scheme chooses *which* positions to mask; the stage around it (``apply.mask_batch`` at prepare
time, the torch collator at load time) works out the candidates and the budget before, and the
80/10/10 replacement after. A scheme is one frozen :class:`MaskingScheme` registered by name
(``mlm_pipeline.masking.register_masking_scheme``).

Budget: ``num_to_predict = min(max_predictions, max(1, round(len(tokens) * masked_lm_prob)))``
per instance, as ``create_pretraining_data.py`` computes it (the length counts ``[CLS]``/``[SEP]``,
rounding is half-to-even like Python's ``round``). Candidates: every non-special token (``[UNK]``
included, as HF's collator; Google's script leaves out only ``[CLS]``/``[SEP]``).

Randomness goes through :class:`Draws`, uniforms addressed by (row, column, purpose): at prepare
time they come from the block's numpy generator in call order (:class:`GeneratorDraws`), at load
time from a counter-based hash of (seed, epoch, sample, column, purpose), so that one scheme's
code serves both and a dynamic mask never depends on the batch a sample lands in.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Literal, Protocol

import numpy as np

from mlm_pipeline.instances.batch import lengths_to_offsets

# purposes of the scheme draws (hash inputs at load time; the collator's own are 1-5)
PURPOSE_ORDER, PURPOSE_NGRAM, PURPOSE_SPAN_LENGTH, PURPOSE_SPAN_ANCHOR, PURPOSE_SPAN_ACCEPT = 16, 17, 18, 19, 20


@dataclass(frozen=True)
class MaskingSpec:
    """The masking settings of a run (or a collator), and what the tokenizer tells about words.

    ``scheme`` ``None``: ``whole-word`` when ``do_whole_word_mask``, else ``token`` (what the
    positional form, kept from before schemes existed, meant). ``do_whole_word_mask`` also makes
    ``ngram`` draw n-grams of words instead of tokens. ``is_continuation``: per vocabulary id,
    whether the token continues a word (the tokenizer's own marker), needed by word schemes.
    """

    masked_lm_prob: float
    max_predictions: int
    vocab_size: int
    mask_id: int
    special_ids: np.ndarray  # ids never masked
    do_whole_word_mask: bool = False
    is_continuation: np.ndarray | None = None  # bool per vocab id, needed for whole-word
    scheme: str | None = None
    ngram: int = 3
    favor_shorter_ngram: bool = True
    geometric_p: float = 0.2
    span_lower: int = 1
    span_upper: int = 10

    @property
    def scheme_name(self) -> str:
        if self.scheme is not None:
            return self.scheme
        return "whole-word" if self.do_whole_word_mask else "token"


@dataclass
class MaskStats:
    masked: int = 0
    replaced_mask: int = 0
    replaced_random: int = 0
    kept: int = 0

    def to_dict(self) -> dict:
        return {
            "masked_tokens": self.masked,
            "masked_as_mask_token": self.replaced_mask,
            "masked_as_random_token": self.replaced_random,
            "masked_kept": self.kept,
        }


class Draws(Protocol):
    """Uniform float32 draws in ``[0, 1)`` for a scheme. ``rows`` are instance indices of the batch."""

    def grid(self, rows: np.ndarray, width: int, purpose: int) -> np.ndarray:
        """``[len(rows), width]``: one draw per (row, column)."""

    def at(self, rows: np.ndarray, cols: np.ndarray, purpose: int) -> np.ndarray:
        """``[len(rows)]``: one draw per (row, column) pair."""


class GeneratorDraws:
    """Draws from a numpy generator, in call order (prepare time: the block's generator)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def grid(self, rows: np.ndarray, width: int, purpose: int) -> np.ndarray:
        return self.rng.random((len(rows), width), dtype=np.float32)  # float32: half the cost of float64

    def at(self, rows: np.ndarray, cols: np.ndarray, purpose: int) -> np.ndarray:
        return self.rng.random(len(rows), dtype=np.float32)


@dataclass(frozen=True)
class Selection:
    """What a scheme chooses from: a batch's flat ids (``offsets`` delimit its ``n`` rows), the
    candidate flag of every token, the budget ``k`` of every row (already at most its
    candidates) and the settings."""

    ids: np.ndarray
    offsets: np.ndarray
    cand: np.ndarray
    k: np.ndarray
    spec: MaskingSpec

    @property
    def n(self) -> int:
        return len(self.offsets) - 1

    @property
    def lens(self) -> np.ndarray:
        return np.diff(self.offsets)

    def continuation(self) -> np.ndarray:
        """Per token, whether the tokenizer marks it as continuing a word."""
        table = self.spec.is_continuation
        if table is None:
            raise ValueError(f"masking scheme {self.spec.scheme_name} needs the tokenizer's word boundaries "
                             "(its continuation table)")
        return table[np.minimum(self.ids, len(table) - 1)]


@dataclass(frozen=True)
class Chosen:
    """A scheme's choice: flat positions, ascending; ``groups`` (one id per position, or None):
    positions that share the 80/10/10 decision (a span)."""

    positions: np.ndarray
    groups: np.ndarray | None = None


ChooseFn = Callable[[Selection, Draws], Chosen]


@dataclass(frozen=True)
class MaskingScheme:
    """One way of choosing masked positions, registered under ``name``.

    ``choose(selection, draws)`` returns at most ``k`` positions per row among its candidates
    (ascending). ``whole_words``: ``never`` (tokens), ``always`` (needs word boundaries), or
    ``option`` (words when ``--do-whole-word-mask``, the default). ``parameters``: the settings
    it reads (a run refuses them with another scheme). ``per_group``: the 80/10/10 choice is made
    once per group of ``Chosen.groups``. ``check(settings)`` raises ``ValueError`` for parameter
    values it cannot work with.
    """

    name: str
    choose: ChooseFn
    help: str
    whole_words: Literal["never", "always", "option"] = "never"
    parameters: tuple[str, ...] = ()
    per_group: bool = False
    check: Callable[[object], None] | None = None


def num_to_predict(lengths: np.ndarray, masked_lm_prob: float, max_predictions: int) -> np.ndarray:
    target = np.rint(lengths * masked_lm_prob).astype(np.int64)  # rint: half to even, like round()
    return np.minimum(max_predictions, np.maximum(1, target))


# Selection works on [rows, width] arrays; bounding the rows bounds their memory (a dupe-5 block
# holds tens of thousands of instances). Draws are made chunk after chunk in row order, which
# yields exactly the numbers one draw for all rows would.
ROWS_PER_CHUNK = 4096
CELLS_PER_CHUNK = ROWS_PER_CHUNK * 512
"""Wider rows take fewer rows a chunk, so that a chunk's arrays stay near this many cells: at
``--max-seq-length 8192`` 4,096 rows made each float32 key grid 134 MB. Up to 512 columns a chunk
is ``ROWS_PER_CHUNK`` rows, as before."""


def chunk_rows(width: int) -> int:
    """Rows per chunk for a selection ``width`` columns wide (the batch's, not a chunk's: the
    chunks, and with them the order of the draws, depend on the batch alone)."""
    return max(1, min(ROWS_PER_CHUNK, CELLS_PER_CHUNK // max(1, width)))
# Whole-word schemes first visit only the ``max(k) + WORD_SLACK`` words of smallest key in each
# row (a budget of k tokens is met within k words unless words overflow it); rows that need more
# are redone with all their words.
WORD_SLACK = 8


def row_counts(a: np.ndarray) -> np.ndarray:
    """True values per row of a 2-D boolean array (as bytes summed in uint16: 2-3x faster than
    ``a.sum(axis=1)``, exact up to 65,535 columns)."""
    return a.view(np.uint8).sum(axis=1, dtype=np.uint16 if a.shape[1] < 1 << 16 else np.int64)


def nonzero_2d(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.nonzero`` of a 2-D array (row-major order), from one flat scan: ~5x faster than
    ``np.nonzero``'s own 2-D path."""
    flat = np.flatnonzero(a)
    return np.divmod(flat, a.shape[1])


def visit_order(keys: np.ndarray, *, sort: bool = True) -> tuple[np.ndarray, int]:
    """Each row's columns by ascending key, equal keys by column (a stable argsort), packed:
    ``(packed, bits)``, column ``packed[i, j] & (2**bits - 1)`` is row ``i``'s ``j``-th. Keys are
    float32 in ``[0, 2]``, whose bit patterns order as the values do, so one int64 per entry holds
    (key bits, column) and a plain sort of those (distinct) numbers is the stable argsort: 15-20x
    faster than ``argsort(kind="stable")``. ``sort=False``: packed, not yet sorted (for a
    partition)."""
    bits = max(1, (keys.shape[1] - 1).bit_length())
    packed = keys.view(np.int32).astype(np.int64)
    packed <<= bits
    packed |= np.arange(keys.shape[1])
    if sort:
        packed.sort(axis=1)
    return packed, bits


def not_special(ids: np.ndarray, special_ids: np.ndarray) -> np.ndarray:
    """``~np.isin(ids, special_ids)`` for non-negative ids: one or two comparisons with the ends
    of a run of ids without special ids, then a table lookup for the few ids outside it (7-9 ms
    -> 3.5 ms on 4.2 M ids). The run is the ids above the largest special id (BERT's
    vocabulary), or the widest run between two special ids where a sample of the ids falls
    there more often: between ``<unk>`` (3) and ``<mask>`` (the last id) in RoBERTa's and XLM-R's,
    where the ids above ``<mask>`` alone left every id to the lookup."""
    special_ids = np.asarray(special_ids)
    if special_ids.size == 0 or int(special_ids.min()) < 0:
        return ~np.isin(ids, special_ids)
    top = int(special_ids.max()) + 1
    table = np.ones(top + 1, dtype=bool)  # the last entry: every id above the specials
    table[special_ids] = False
    cand = None
    edges = np.sort(special_ids, axis=None)  # np.unique's result, without the numpy.ma that np.unique imports
    edges = edges[np.append(True, edges[1:] != edges[:-1])]
    if edges.size > 1 and ids.dtype.kind in "iu":
        inner = int(np.argmax(np.diff(edges)))  # the widest run between two special ids
        low, high = ids.dtype.type(edges[inner]), ids.dtype.type(edges[inner + 1])
        sample = ids[:: max(1, ids.size // 1024)]
        if np.count_nonzero((sample > low) & (sample < high)) > np.count_nonzero(sample >= top):
            cand = ids > low
            cand &= ids < high  # two comparisons: still 2-3x faster than a lookup of every id
    if cand is None:
        cand = ids >= top  # every id above the specials; one comparison, 2-3x faster than a lookup
    outside = np.flatnonzero(~cand)  # the few others (the specials, and ids outside the run)
    cand[outside] = table[np.minimum(ids[outside], top)]
    return cand


@dataclass(frozen=True)
class Words:
    """The words (groups of candidate positions) of a batch, in position order. Words tile the
    candidates: word ``w`` is the candidates ``bounds[w]:bounds[w + 1]`` (``cand_pos`` gives their
    flat positions), so ``bounds[w]`` also counts the candidate tokens before it. ``first``
    (``n + 1`` offsets): the words of row ``i`` are ``first[i]:first[i + 1]``. ``start`` (flat
    position of a word's first token), ``length`` (tokens), ``row`` and ``of_cand`` (the word of
    each candidate) are worked out when a scheme asks for them."""

    bounds: np.ndarray
    first: np.ndarray
    cand_pos: np.ndarray

    def __len__(self) -> int:
        return len(self.bounds) - 1

    @functools.cached_property
    def start(self) -> np.ndarray:
        return self.cand_pos[self.bounds[:-1]]

    @functools.cached_property
    def length(self) -> np.ndarray:
        return np.diff(self.bounds)

    @functools.cached_property
    def row(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.first) - 1), np.diff(self.first))

    @functools.cached_property
    def of_cand(self) -> np.ndarray:
        starts = np.zeros(len(self.cand_pos), dtype=bool)
        starts[self.bounds[:-1]] = True
        return np.cumsum(starts) - 1

    def positions(self, chosen_word: np.ndarray) -> np.ndarray:
        """Flat positions (ascending) of the chosen words' tokens (work in the chosen tokens, not
        in all candidates)."""
        chosen = np.flatnonzero(chosen_word)
        at = self.bounds[chosen]
        length = self.bounds[chosen + 1] - at
        if len(chosen) and int(length.max()) > 1:  # the candidates of each word, one after another
            ends = np.cumsum(length)
            at = np.repeat(at - (ends - length), length) + np.arange(int(ends[-1]))
        return self.cand_pos[at]


def find_words(sel: Selection, *, whole_words: bool, cross_specials: bool) -> Words:
    """Group the candidates into words.

    Without ``whole_words`` every candidate is a word. With it a word starts at a candidate that
    is not a continuation piece, and at a row's first candidate. ``cross_specials``: a
    continuation right after a special token joins the word before it, as Google's and ALBERT's
    scripts group (so a word can straddle ``[SEP]``); otherwise a special token always ends a
    word.
    """
    cand_pos = np.flatnonzero(sel.cand)
    count = len(cand_pos)
    row_cand = np.searchsorted(cand_pos, sel.offsets)  # each row's first candidate (n + 1, as offsets)
    if whole_words and count:
        table = sel.spec.is_continuation
        if table is None:
            sel.continuation()  # (raises: the scheme needs word boundaries)
        starts = np.empty(count + 1, dtype=bool)  # (a last start closes the last word)
        # clip: ids past the table read its last entry, as Selection.continuation (ids are >= 0)
        np.take(np.logical_not(table), sel.ids[cand_pos], mode="clip", out=starts[:count])
        starts[count] = True
        heads = row_cand[:-1]
        starts[heads[heads < count]] = True  # a row's first candidate
        if not cross_specials:
            starts[1:count] |= cand_pos[1:] != cand_pos[:-1] + 1
        bounds = np.flatnonzero(starts)
    else:
        bounds = np.arange(count + 1)
    first = np.searchsorted(bounds, row_cand)  # words before each row's first candidate
    return Words(bounds=bounds, first=first, cand_pos=cand_pos)
