"""The objective contract: what every instance builder takes, returns and declares.

An objective turns a block of tokenized documents into unmasked (or, in reference mode, already
masked) instances. It is one frozen :class:`Objective` value registered by name
(``mlm_pipeline.instances.register_objective``); the task calls ``objective.build(docs, ctx)``
and never looks at the name. Masking is a separate stage run by the task after building.

A builder must be a pure function of ``(docs, ctx)``: every random draw comes from ``ctx.rng``
(seeded from the global seed, the task and the block), so output never depends on worker count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Sequence

import numpy as np

from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets, range_documents

if TYPE_CHECKING:  # types only: importing this package must not load the tokenizer library
    from mlm_pipeline.stats import ReadStats
    from mlm_pipeline.tokenize import SpecialIds, TextTokenizer

Masking = Literal["static", "none"]


@dataclass
class TokenizedDocs:
    """A block of tokenized documents: flat ids, per-sentence lengths, per-document sentence counts.

    Sentences that tokenized to nothing and documents left without a sentence are already gone
    (``read_index`` says which documents of the block as read are left).
    """

    ids: np.ndarray  # int32 [tokens]
    sentence_lengths: np.ndarray  # int64 [sentences], all > 0
    doc_sentences: np.ndarray  # int64 [documents], all > 0
    # each document's index among the documents read into the block (those dropped above are
    # missing), for naming an instance's source records; None where nobody asks
    read_index: np.ndarray | None = None

    @property
    def sentence_offsets(self) -> np.ndarray:
        return lengths_to_offsets(self.sentence_lengths)

    @property
    def doc_offsets(self) -> np.ndarray:
        return lengths_to_offsets(self.doc_sentences)


@dataclass(frozen=True)
class BuildContext:
    """What a builder gets besides the documents: the run's settings (``max_seq_length``,
    ``dupe_factor``, ...), the tokenizer (special ids, vocab size) and the block's generator.

    ``settings`` is the run's ``PrepareConfig``; it is typed ``Any`` because ``config`` imports
    this package (to check ``objective`` against the registry), not the other way round.
    """

    settings: Any
    tokenizer: TextTokenizer
    rng: np.random.Generator

    @property
    def special(self) -> SpecialIds:
        return self.tokenizer.special

    @property
    def tracks_sources(self) -> bool:
        """Whether the run asks which documents each instance comes from (``--id-field``,
        ``--metadata-field``): builders then fill the batch's ``source_documents`` (indices into
        the block's documents), and only then (no cost otherwise)."""
        return tracks_sources(self.settings)


def tracks_sources(settings: Any) -> bool:
    """Whether ``settings`` ask for each instance's source documents (see :class:`BuildContext`)."""
    return getattr(settings, "id_field", None) is not None or getattr(settings, "metadata_field", None) is not None


def document_token_bounds(docs: TokenizedDocs, *, separated: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Each document's ``[start, end)`` in the block's tokens (``docs.ids``), or with ``separated``
    in its token stream (one separator between documents: :func:`~.single_segment.token_stream`)."""
    n = len(docs.doc_sentences)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    bounds = docs.sentence_offsets[docs.doc_offsets]
    starts = bounds[:-1] + (np.arange(n) if separated else 0)
    return starts, starts + np.diff(bounds)


def with_sources(batch: InstanceBatch, docs: TokenizedDocs, starts: np.ndarray, lens: np.ndarray, *,
                 separated: bool, rows: np.ndarray | None = None) -> InstanceBatch:
    """``batch`` with the documents its rows' token ranges come from (``source_documents``):
    ranges of ``docs.ids``, or with ``separated`` of its token stream; one range a row unless
    ``rows`` says which row each range belongs to."""
    doc_starts, doc_ends = document_token_bounds(docs, separated=separated)
    rows = np.arange(len(starts)) if rows is None else rows
    batch.source_documents, batch.source_offsets = range_documents(doc_starts, doc_ends, starts, lens, rows, len(batch))
    return batch


@dataclass(frozen=True)
class ReferenceContext:
    """What a reference mode gets besides its input files: the settings (its seed included: a
    reference draws its own random stream, as the script it reproduces does), the tokenizer, and
    the read counters it must fill (bytes, documents, sentences). ``settings`` is the run's
    ``PrepareConfig``, typed ``Any`` as in :class:`BuildContext`."""

    settings: Any
    tokenizer: TextTokenizer
    read_stats: ReadStats
    # filled by a reference that encodes with an encoder of its own (the backend record of the
    # task marker); empty: the run's tokenizer encoded
    tokenizer_backend: dict = field(default_factory=dict)


BuildFn = Callable[[TokenizedDocs, BuildContext], "tuple[InstanceBatch, dict[str, int]]"]
ReferenceFn = Callable[[Sequence[str], ReferenceContext], Iterator["tuple[InstanceBatch, dict[str, int]]"]]


@dataclass(frozen=True)
class ReferenceMode:
    """An objective's reference mode: reproduce another tool's output instance for instance.

    ``build(urls, ctx)`` reads the task's input files whole (its own parsing and tokenizer
    quirks) and yields ``(batch, counts)`` pairs in output order; ``counts`` may hold ``tokens``
    (tokens read). ``unit`` is what one task holds: ``"file"`` (one task per input file, as
    Google's BERT script run per file) or ``"corpus"`` (every input file in one task, for a
    script that reads a whole directory). ``masking`` is the masking its output carries; a run in
    reference mode must ask for exactly that. ``num_out_files``: the script's fixed number of
    output files, the run's ``--num-out-files`` unless given (``None``: ordinary shards).
    ``tokenizer_warning(tokenizer)``: why this tokenizer cannot give the script's tokens, if so
    (``prepare`` warns once, before any task).
    """

    build: ReferenceFn
    unit: Literal["file", "corpus"]
    masking: Masking
    help: str
    num_out_files: int | None = None
    tokenizer_warning: Callable[[TextTokenizer], str | None] | None = None
    masking_schemes: tuple[str, ...] = ("token", "whole-word")  # the --masking-scheme values it reproduces


@dataclass(frozen=True)
class Objective:
    """One way of building instances, registered under ``name``.

    ``build(docs, ctx)`` returns the block's instances in their final (shuffled) order and
    ``counts`` to add to the task's stats (``instances`` at least). ``has_nsp_labels`` says
    whether its batches carry ``next_sentence_labels``; ``default_masking`` is the ``--masking``
    used when none is given; ``reference`` is its reference mode, if it has one.

    ``sequence_features_only``: unmasked, its shards hold only ``input_ids``, ``input_mask`` and
    ``segment_ids`` (ELECTRA's layout: the trainer masks), written with no masked-LM slots
    (``max_predictions`` 0); otherwise BERT's full layout, empty masked-LM features included (as
    ``tokens`` and ``packed`` write with ``--masking none``). ``tokenizer_flavor``: the text
    normalization ``--tokenizer-flavor auto`` resolves to. ``check(settings)``: raises
    ``ValueError`` for settings the objective cannot work with (run as part of config validation).
    ``load_masking``: how the torch loader masks its unmasked outputs: ``dynamic`` (BERT's
    80/10/10) or ``electra`` (ELECTRA's: with replacement, 85% ``[MASK]``, no random tokens).
    ``cuts_long_sentences``: a sentence longer than an instance loses its excess tokens (BERT's
    pairs are truncated, ELECTRA's examples end), so a paragraph read as one sentence loses much
    of itself; the plan warns of inputs that look like a paragraph per line.
    ``word_continuation(tokenizer)``: per id, whether the token continues a word, for the
    masking schemes that mask words, when the objective's script groups words otherwise than the
    tokenizer's marker (``sop``: ALBERT's start-piece test, which makes a CJK piece a word of its
    own); None: the tokenizer's own ``is_continuation``.
    """

    name: str
    build: BuildFn
    help: str
    has_nsp_labels: bool
    default_masking: Masking = "static"
    reference: ReferenceMode | None = None
    sequence_features_only: bool = False
    tokenizer_flavor: str = "bert"
    check: Callable[[Any], None] | None = None
    load_masking: Literal["dynamic", "electra"] = "dynamic"
    cuts_long_sentences: bool = False
    default_masking_scheme: str = "token"  # --masking-scheme when none is given (mlm_pipeline.masking)
    word_continuation: Callable[[Any], np.ndarray] | None = None
    label_names: tuple[str, str] = ("actual next", "random next")  # what labels 0 and 1 mean (inspect)
    # the torch batch's key for its pair label: the argument of the HF model that trains on it
    # (BertForPreTraining's next_sentence_label, AlbertForPreTraining's sentence_order_label)
    sentence_label: str = "next_sentence_label"

    def writes_sequence_features_only(self, masking: str) -> bool:
        """Whether a run with this ``--masking`` writes ELECTRA's three features only."""
        return self.sequence_features_only and masking == "none"


def copies_need_masks(settings) -> None:
    """The ``check`` of objectives built with :func:`repeat_shuffled`: they cut the same instances
    on every pass, so with no masks ``--dupe-factor N`` would write N identical copies of each."""
    if settings.dupe_factor > 1 and settings.masking == "none":
        raise ValueError(
            f"--dupe-factor {settings.dupe_factor} with --objective {settings.objective} and --masking none would "
            f"write {settings.dupe_factor} identical copies of every instance (this objective cuts the same ones on "
            "every pass; only masks tell the copies apart): use --dupe-factor 1 and mask at load time, which "
            "draws new masks each epoch, or --masking static")


def shuffled_copies(n: int, copies: int, rng: np.random.Generator) -> np.ndarray:
    """``copies`` of each of ``n`` rows, all in one random order: the rows to take, in order.
    A builder that cuts rows as ranges of its tokens permutes the ranges with it before the
    one gather of their tokens (a second gather of a ``packed`` block: 10 ms of its 40)."""
    return rng.permutation(n * copies) % max(n, 1)


def repeat_shuffled(batch: InstanceBatch, copies: int, rng: np.random.Generator) -> InstanceBatch:
    """``copies`` of every row, all in one random order (masking later tells the copies apart):
    ``dupe_factor`` for builders whose instances do not depend on random draws."""
    return batch.take(shuffled_copies(len(batch), copies, rng))


_UNIFORM_BLOCK = 8192


def uniform_stream(rng: np.random.Generator) -> Callable[[], float]:
    """A function returning the next uniform of ``rng``, drawn in blocks of 8192 (the first at
    once): scalar draws from a numpy Generator cost about a microsecond each, and builders that
    decide instance by instance (``nsp``, ``electra``) make several draws per instance."""
    first = rng.random(_UNIFORM_BLOCK).tolist()

    def stream() -> Iterator[float]:
        yield from first
        while True:
            yield from rng.random(_UNIFORM_BLOCK).tolist()

    return stream().__next__
