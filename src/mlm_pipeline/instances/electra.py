"""ELECTRA pretraining examples: the semantics of google-research/electra ``build_pretraining_dataset.py``.

The example builder
-------------------
Sentences (lines) of a document accumulate until their token count reaches the target length
(which starts at ``max_seq_length``); the end of a document makes an example of whatever is
pending, however short. Tokens past what fits are dropped, never carried over. Making an
example draws, in this order:

1. ``random() < 0.1``: one segment (first-segment target 100000), else the first-segment
   target is ``(target - 3) // 2`` of the current target;
2. per sentence, in order: it joins the first segment if the first segment is empty, or it
   still fits (``len(first) + len(s) < first_target``), or — only when both fail — the second
   segment is empty, the first is below its target and ``random() < 0.5``; otherwise it joins
   the second segment (so the first segment can be non-contiguous text);
3. the first segment is cut to ``max_seq_length - 2`` tokens, the second to
   ``max_seq_length - len(first) - 3`` (it may vanish);
4. ``random() < 0.05``: the next target is ``randint(5, max_seq_length)``, else
   ``max_seq_length``.

An example is ``[CLS] first [SEP]`` plus ``second [SEP]`` when the second segment is not
empty, with segment ids 0 then 1. There is no masking and no next-sentence label: ELECTRA masks
at training time (see ``mlm_pipeline.electra_masking``).

Two modes share that logic (``plan_example``, ``next_target``):

* reference mode (:func:`electra_reference_examples`) reproduces ELECTRA's output example for
  example: a corpus directory is read like ELECTRA reads it (files in sorted name order, then
  ``random.shuffle``; TensorFlow ``GFile`` lines; one builder whose target carries over from
  file to file; the end of each file flushes) with one ``random.Random(seed)`` making every draw
  in ELECTRA's order — ELECTRA's run with ``random.seed(seed)`` before ``write_examples(0,
  args)`` and ``--num-processes 1``. It runs on one core and holds one file in memory at a time.
* default mode (:func:`build_electra_instances`) builds a block of tokenized documents with a
  numpy ``Generator``: the same distribution, deterministic for any worker count. The segment
  assignment loops once per sentence and the tokens are gathered in one vectorised step. A
  block starts with a target drawn as after an example (5% random), so every example, not only
  those after the first of a block, sees the reference's target distribution.

Output naming: ELECTRA writes example ``n`` to ``pretrain_data.tfrecord-{n % N}-of-{N}`` (N = 1000
upstream), see :func:`output_file_name` and :func:`round_robin_rows`.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

import numpy as np

from mlm_pipeline import fs
from mlm_pipeline.errors import ConfigError, InputError
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets, ranges_to_indices
from mlm_pipeline.instances.base import (
    BuildContext,
    Objective,
    ReferenceContext,
    ReferenceMode,
    TokenizedDocs,
    uniform_stream,
)
from mlm_pipeline.run import layout
from mlm_pipeline.stats import ReadStats
from mlm_pipeline.tokenize import TextTokenizer

ONE_SEGMENT_PROB = 0.1
ONE_SEGMENT_TARGET = 100000
JOIN_FIRST_PROB = 0.5
RANDOM_TARGET_PROB = 0.05
MIN_RANDOM_TARGET = 5

FEATURES = ("input_ids", "input_mask", "segment_ids")
"""The only features ELECTRA writes (int64, padded to ``max_seq_length``)."""

OUTPUT_PREFIX = layout.OUT_FILE_PREFIX
DEFAULT_NUM_OUT_FILES = 1000

# Lines tokenized per tokenizer call in reference mode.
_LINES_PER_CALL = 4096


class Draws(Protocol):
    """The two random calls ELECTRA makes (``random.Random`` has them as they are)."""

    def random(self) -> float: ...

    def randint(self, a: int, b: int) -> int: ...


class NumpyDraws:
    """``Draws`` from a numpy ``Generator`` (uniforms drawn in blocks, as the NSP builder does)."""

    def __init__(self, rng: np.random.Generator):
        self.random = uniform_stream(rng)

    def randint(self, a: int, b: int) -> int:
        """Uniform integer in ``[a, b]`` inclusive."""
        x = int(self.random() * (b - a + 1))
        return a + (x if x <= b - a else b - a)


@dataclass
class ElectraStats:
    instances: int = 0
    single_segment: int = 0  # examples without a second segment (after trimming)
    one_segment_draws: int = 0  # examples whose first draw chose one segment
    random_target: int = 0  # examples built under a random target length
    truncated: int = 0  # examples that lost tokens to trimming
    dropped_tokens: int = 0

    def add(self, plan: "Plan", random_target: bool) -> None:
        self.instances += 1
        self.single_segment += plan.kept_second == 0
        self.one_segment_draws += plan.one_segment
        self.random_target += random_target
        lost = plan.first_total + plan.second_total - plan.kept_first - plan.kept_second
        self.truncated += lost > 0
        self.dropped_tokens += lost

    def to_dict(self) -> dict:
        return {
            "instances": self.instances,
            "single_segment": self.single_segment,
            "one_segment_draws": self.one_segment_draws,
            "random_target": self.random_target,
            "truncated_examples": self.truncated,
            "dropped_tokens": self.dropped_tokens,
        }


def check_settings(*, max_seq_length: int, num_out_files: int | None = None) -> None:
    """``ConfigError`` for settings ELECTRA's builder cannot work with."""
    if max_seq_length < MIN_RANDOM_TARGET:
        raise ConfigError(
            f"--max-seq-length must be at least {MIN_RANDOM_TARGET} for --objective electra "
            f"(its random target lengths are drawn from [{MIN_RANDOM_TARGET}, max]), got {max_seq_length}"
        )
    if num_out_files is not None and num_out_files < 1:
        raise ConfigError(f"--num-out-files must be at least 1, got {num_out_files}")


# --------------------------------------------------------------------------------------------
# The builder's decisions (shared by both modes)
# --------------------------------------------------------------------------------------------


@dataclass
class Plan:
    """One example's decisions: the segment of each pending sentence, and tokens before and after
    trimming."""

    to_first: list[bool]
    first_total: int
    second_total: int
    kept_first: int
    kept_second: int
    one_segment: bool


def plan_example(lengths: Sequence[int], target: int, max_seq_length: int, draws: Draws) -> Plan:
    """Where each pending sentence goes and how much of each segment is kept.

    Sentences must be non-empty: an empty sentence never draws (it always fits or meets a failed
    guard) and adds nothing, so ELECTRA's output is the same without it.
    """
    one_segment = draws.random() < ONE_SEGMENT_PROB
    first_target = ONE_SEGMENT_TARGET if one_segment else (target - 3) // 2
    to_first: list[bool] = []
    n_first = n_second = 0
    for n in lengths:
        if (
            n_first == 0
            or n_first + n < first_target
            or (n_second == 0 and n_first < first_target and draws.random() < JOIN_FIRST_PROB)
        ):
            to_first.append(True)
            n_first += n
        else:
            to_first.append(False)
            n_second += n
    kept_first = min(n_first, max_seq_length - 2)
    kept_second = min(n_second, max(0, max_seq_length - kept_first - 3))
    return Plan(to_first, n_first, n_second, kept_first, kept_second, one_segment)


def next_target(max_seq_length: int, draws: Draws) -> tuple[int, bool]:
    """The target length of the next example, and whether it was drawn at random."""
    if draws.random() < RANDOM_TARGET_PROB:
        return draws.randint(MIN_RANDOM_TARGET, max_seq_length), True
    return max_seq_length, False


# --------------------------------------------------------------------------------------------
# Reference mode
# --------------------------------------------------------------------------------------------


class ExampleBuilder:
    """ELECTRA's ``ExampleBuilder`` on token ids: feed lines, get examples as they complete."""

    def __init__(self, max_seq_length: int, cls_id: int, sep_id: int, draws: Draws, stats: ElectraStats):
        check_settings(max_seq_length=max_seq_length)
        self.max_seq_length = max_seq_length
        self.cls_id = cls_id
        self.sep_id = sep_id
        self.draws = draws
        self.stats = stats
        self.sentences: list[list[int]] = []
        self.length = 0
        self.target = max_seq_length
        self.target_is_random = False

    def add_line(self, ids: list[int] | None) -> tuple[list[int], list[int]] | None:
        """A stripped line's token ids, or ``None`` for a blank line; returns a finished example.

        A blank line ends the pending example when it holds a token; otherwise (like a line
        that tokenizes to nothing) it changes nothing.
        """
        if ids is None:
            return self._make() if self.length else None
        if ids:
            self.sentences.append(ids)
            self.length += len(ids)
            if self.length >= self.target:
                return self._make()
        return None

    def _make(self) -> tuple[list[int], list[int]]:
        plan = plan_example([len(s) for s in self.sentences], self.target, self.max_seq_length, self.draws)
        first: list[int] = []
        second: list[int] = []
        for sentence, f in zip(self.sentences, plan.to_first):
            (first if f else second).extend(sentence)
        self.stats.add(plan, self.target_is_random)
        self.sentences = []
        self.length = 0
        self.target, self.target_is_random = next_target(self.max_seq_length, self.draws)
        input_ids = [self.cls_id, *first[: plan.kept_first], self.sep_id]
        segment_ids = [0] * len(input_ids)
        if plan.kept_second:
            input_ids += [*second[: plan.kept_second], self.sep_id]
            segment_ids += [1] * (plan.kept_second + 1)
        return input_ids, segment_ids


def list_corpus_files(corpus_dir: str) -> list[str]:
    """The files of a corpus directory in ELECTRA's order before its shuffle: sorted names.

    ELECTRA lists the directory flat (no recursion) and reads every entry, hidden files
    included; a sub-directory would make it fail, so it is an error here too.
    """
    filesystem, path = fs.get_fs(corpus_dir)
    if not filesystem.isdir(path):
        raise InputError(f"{corpus_dir}: --objective electra --reference reads a corpus directory; this is not one")
    entries = filesystem.ls(path, detail=True)
    subdirs = [e["name"] for e in entries if e.get("type") == "directory"]
    if subdirs:
        raise InputError(
            f"{corpus_dir}: ELECTRA's reader takes a flat directory of text files; it holds "
            f"sub-directories ({', '.join(sorted(s.rsplit('/', 1)[-1] for s in subdirs))})"
        )
    names = sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries)
    if not names:
        raise InputError(f"{corpus_dir}: the corpus directory is empty")
    return [fs.join(corpus_dir, name) for name in names]


def read_gfile_lines(url: str) -> list[str]:
    """A file's lines as TensorFlow's ``GFile`` gives them to ELECTRA, each ``str.strip()``ped.

    Lines end at ``\\n`` only; every ``\\r`` is dropped wherever it is; a last line without
    ``\\n`` still counts; each line must be valid UTF-8 (ELECTRA's run aborts otherwise).
    """
    with fs.open_url(url, "rb") as f:
        data = f.read()
    raw = data.replace(b"\r", b"").split(b"\n")
    if raw[-1] == b"":
        raw.pop()
    lines = []
    for number, line in enumerate(raw, 1):
        try:
            lines.append(line.decode("utf-8").strip())
        except UnicodeDecodeError as exc:
            raise InputError(f"{url}: line {number} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    return lines


def shuffled_files(files: Sequence[str], random_seed: int) -> list[str]:
    """The order ELECTRA reads ``files`` (given sorted) in, under ``random.seed(random_seed)``."""
    order = list(files)
    random.Random(random_seed).shuffle(order)
    return order


def electra_reference_examples(
    files: Sequence[str],
    tokenizer: TextTokenizer,
    *,
    max_seq_length: int,
    random_seed: int,
    stats: ElectraStats | None = None,
    read_stats: ReadStats | None = None,
) -> Iterator[tuple[list[int], list[int]]]:
    """ELECTRA's examples, in the order it makes them, as (input_ids, segment_ids) unpadded.

    ``files``: the corpus directory's files in sorted name order (:func:`list_corpus_files`);
    they are shuffled here with the seeded generator, which then makes every other draw.
    ``tokenizer`` should be loaded with ``flavor="electra"`` and ELECTRA's lower-casing setting.
    ``read_stats``, if given, counts the bytes, documents (runs of non-blank lines) and
    sentences (non-blank lines) read.
    """
    draws = random.Random(random_seed)
    order = list(files)
    draws.shuffle(order)  # ELECTRA's random.shuffle(fnames): the first draws of the run
    special = tokenizer.special
    builder = ExampleBuilder(max_seq_length, special.cls, special.sep, draws, stats or ElectraStats())
    for url in order:
        lines = read_gfile_lines(url)
        if read_stats is not None:
            _count_read(url, lines, read_stats)
        for start in range(0, len(lines), _LINES_PER_CALL):
            chunk = lines[start : start + _LINES_PER_CALL]
            texts = [line for line in chunk if line]
            ids, lens = tokenizer.encode_batch(texts)
            per_text = np.split(ids, np.cumsum(lens)[:-1]) if texts else []
            k = 0
            for line in chunk:
                if line:
                    example = builder.add_line(per_text[k].tolist())
                    k += 1
                else:
                    example = builder.add_line(None)
                if example is not None:
                    yield example
        example = builder.add_line(None)  # the end of each file flushes
        if example is not None:
            yield example


def _count_read(url: str, lines: list[str], read_stats: ReadStats) -> None:
    read_stats.bytes_read += fs.file_size(url)
    in_document = False
    for line in lines:
        if line:
            read_stats.sentences += 1
            read_stats.documents_read += not in_document
        in_document = bool(line)


def examples_to_batch(examples: Sequence[tuple[list[int], list[int]]]) -> InstanceBatch:
    """(input_ids, segment_ids) pairs as an unmasked ``InstanceBatch`` without NSP labels."""
    n = len(examples)
    if n == 0:
        return InstanceBatch.empty(with_nsp=False)
    lens = np.fromiter((len(ids) for ids, _ in examples), np.int64, count=n)
    return InstanceBatch.unmasked(
        input_ids=np.fromiter((t for ids, _ in examples for t in ids), np.int32, count=int(lens.sum())),
        segment_ids=np.fromiter((s for _, seg in examples for s in seg), np.int8, count=int(lens.sum())),
        offsets=lengths_to_offsets(lens),
    )


# --------------------------------------------------------------------------------------------
# Output naming
# --------------------------------------------------------------------------------------------


def output_file_name(index: int, num_out_files: int = DEFAULT_NUM_OUT_FILES) -> str:
    """ELECTRA's name of output file ``index`` (not zero-padded)."""
    return layout.out_file_name(index, num_out_files)


def output_file_index(example_index: int, num_out_files: int = DEFAULT_NUM_OUT_FILES) -> int:
    """The output file ELECTRA writes example ``example_index`` (0-based, in making order) to."""
    return example_index % num_out_files


def round_robin_rows(n_examples: int, num_out_files: int = DEFAULT_NUM_OUT_FILES) -> list[np.ndarray]:
    """Per output file, the example indices it holds in record order (all files, some empty)."""
    check_settings(max_seq_length=MIN_RANDOM_TARGET, num_out_files=num_out_files)
    return [np.arange(i, n_examples, num_out_files, dtype=np.int64) for i in range(num_out_files)]


def padded_features(batch: InstanceBatch, max_seq_length: int) -> dict[str, np.ndarray]:
    """ELECTRA's three features, int64 ``[n, max_seq_length]``."""
    padded = batch.padded(max_seq_length, 0)
    return {name: padded[name] for name in FEATURES}


# --------------------------------------------------------------------------------------------
# Default mode
# --------------------------------------------------------------------------------------------


def build_electra_instances(
    docs: TokenizedDocs,
    *,
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    rng: np.random.Generator,
    sources: bool = False,
) -> tuple[InstanceBatch, ElectraStats]:
    """ELECTRA examples of a block of documents, in document order (no NSP labels, no masks)."""
    return build_with_draws(docs, max_seq_length=max_seq_length, cls_id=cls_id, sep_id=sep_id, draws=NumpyDraws(rng),
                            sources=sources)


def build_with_draws(
    docs: TokenizedDocs,
    *,
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    draws: Draws,
    start_target: int | None = None,
    sources: bool = False,
) -> tuple[InstanceBatch, ElectraStats]:
    """:func:`build_electra_instances` with any ``Draws``.

    The first target is ``start_target`` if given (no draw), else drawn as after an example.
    With ``random.Random`` draws, ``start_target=max_seq_length`` and the documents of files
    already shuffled, this makes exactly the reference's examples (the tests check it).
    ``sources``: each example's document (an example never spans two), as ``source_documents``.
    """
    check_settings(max_seq_length=max_seq_length)
    stats = ElectraStats()
    sent_off = docs.sentence_offsets.tolist()
    sent_len = docs.sentence_lengths.tolist()
    doc_off = docs.doc_offsets.tolist()
    # Pieces to gather: (source token offset, length, destination offset); per example its
    # kept lengths (first, second).
    src: list[int] = []
    length: list[int] = []
    dst: list[int] = []
    kept: list[tuple[int, int]] = []
    example_doc: list[int] = []
    out_pos = 0
    if start_target is None:
        target, target_is_random = next_target(max_seq_length, draws)
    else:
        target, target_is_random = start_target, False
    for d in range(len(doc_off) - 1):
        s0, s1 = doc_off[d], doc_off[d + 1]
        i = s0
        while i < s1:
            # sentences i..j-1: the first j whose running total reaches the target, or the
            # document's end (where ELECTRA's blank line flushes the rest)
            j = bisect_left(sent_off, sent_off[i] + target, i + 1, s1)
            plan = plan_example(sent_len[i:j], target, max_seq_length, draws)
            stats.add(plan, target_is_random)
            kf, ks = plan.kept_first, plan.kept_second
            # first segment after [CLS], second after the first [SEP]
            for want_first, budget, pos in ((True, kf, out_pos + 1), (False, ks, out_pos + kf + 2)):
                for k, f in zip(range(i, j), plan.to_first):
                    if budget == 0:
                        break
                    if f == want_first:
                        take = min(sent_len[k], budget)
                        src.append(sent_off[k])
                        length.append(take)
                        dst.append(pos)
                        pos += take
                        budget -= take
            kept.append((kf, ks))
            example_doc.append(d)
            out_pos += kf + 2 + (ks + 1 if ks else 0)
            target, target_is_random = next_target(max_seq_length, draws)
            i = j
    n = len(kept)
    if n == 0:
        return InstanceBatch.empty(with_nsp=False), stats
    kept_arr = np.asarray(kept, np.int64).reshape(n, 2)
    kf_arr, ks_arr = kept_arr[:, 0], kept_arr[:, 1]
    offsets = lengths_to_offsets(kf_arr + 2 + np.where(ks_arr > 0, ks_arr + 1, 0))
    ids = np.empty(int(offsets[-1]), np.int32)
    seg = np.zeros(int(offsets[-1]), np.int8)
    starts = offsets[:-1]
    ids[starts] = cls_id
    ids[starts + kf_arr + 1] = sep_id
    two = ks_arr > 0
    ids[offsets[1:][two] - 1] = sep_id
    ids[ranges_to_indices(np.asarray(dst, np.int64), np.asarray(length, np.int64))] = docs.ids[
        ranges_to_indices(np.asarray(src, np.int64), np.asarray(length, np.int64))
    ]
    seg[ranges_to_indices(starts[two] + kf_arr[two] + 2, ks_arr[two] + 1)] = 1
    batch = InstanceBatch.unmasked(ids, seg, offsets)
    if sources:
        batch.source_documents, batch.source_offsets = np.asarray(example_doc, np.int64), np.arange(n + 1)
    return batch, stats


# --------------------------------------------------------------------------------------------
# The objective: ``--objective electra``
# --------------------------------------------------------------------------------------------


def build(docs: TokenizedDocs, ctx: BuildContext) -> tuple[InstanceBatch, dict]:
    """The ``electra`` objective: ``dupe_factor`` passes over the block (each with its own draws),
    examples in document order (ELECTRA writes them in the order it makes them)."""
    settings = ctx.settings
    batches, totals = [], ElectraStats()
    for _ in range(settings.dupe_factor):
        batch, stats = build_electra_instances(
            docs, max_seq_length=settings.max_seq_length, cls_id=ctx.special.cls, sep_id=ctx.special.sep, rng=ctx.rng,
            sources=ctx.tracks_sources)
        batches.append(batch)
        for name in vars(totals):
            setattr(totals, name, getattr(totals, name) + getattr(stats, name))
    return (batches[0] if len(batches) == 1 else InstanceBatch.concat(batches)), totals.to_dict()


_EXAMPLES_PER_BATCH = 8192


def build_reference(urls: Sequence[str], ctx: ReferenceContext) -> Iterator[tuple[InstanceBatch, dict]]:
    """The ``electra`` reference mode: the corpus directory read as ELECTRA reads it (its own
    listing, not the planned files: ELECTRA reads empty and hidden files too, and they take part
    in its seeded shuffle), one random stream for the whole run, examples in making order."""
    settings = ctx.settings
    files = list_corpus_files(settings.inputs[0])
    stats = ElectraStats()
    examples = electra_reference_examples(
        files, ctx.tokenizer, max_seq_length=settings.max_seq_length, random_seed=settings.random_seed,
        stats=stats, read_stats=ctx.read_stats,
    )
    reported = ElectraStats().to_dict()
    pending: list[tuple[list[int], list[int]]] = []

    def flush() -> tuple[InstanceBatch, dict]:
        nonlocal reported
        now = stats.to_dict()
        counts = {k: now[k] - reported[k] for k in now}
        # tokens read: those kept (without [CLS] and the [SEP]s) plus those trimmed away
        kept = sum(len(ids) - 2 - (segments[-1] == 1) for ids, segments in pending)
        counts["tokens"] = int(kept + counts["dropped_tokens"])
        reported = now
        batch = examples_to_batch(pending)
        pending.clear()
        return batch, counts

    for example in examples:
        pending.append(example)
        if len(pending) == _EXAMPLES_PER_BATCH:
            yield flush()
    if pending:
        yield flush()


def check_objective_settings(settings) -> None:
    """``electra``'s settings checks (config validation): lengths, output files, and in reference
    mode one corpus directory as input (ELECTRA's ``--corpus-dir``)."""
    check_settings(max_seq_length=settings.max_seq_length, num_out_files=settings.num_out_files)
    if settings.reference:
        if len(settings.inputs) != 1:
            raise ConfigError(
                f"--objective electra --reference reads one corpus directory, as ELECTRA's --corpus-dir; "
                f"got {len(settings.inputs)} inputs"
            )
        filesystem, path = fs.get_fs(settings.inputs[0])
        if not filesystem.isdir(path):
            raise ConfigError(
                f"--objective electra --reference reads a corpus directory (ELECTRA's --corpus-dir); "
                f"{settings.inputs[0]} is not a directory"
            )


ELECTRA_REFERENCE = ReferenceMode(
    build=build_reference,
    unit="corpus",
    masking="none",
    help="google-research/electra build_pretraining_dataset.py with --num-processes 1 and random.seed(SEED), "
    "on one corpus directory; 1000 output files by default",
    num_out_files=DEFAULT_NUM_OUT_FILES,
)

OBJECTIVE = Objective(
    name="electra",
    build=build,
    help="ELECTRA examples ([CLS] A [SEP] B [SEP], 10% one segment, 5% random lengths) with only input_ids, "
    "input_mask and segment_ids: the trainer masks (default --masking none)",
    has_nsp_labels=False,
    default_masking="none",
    reference=ELECTRA_REFERENCE,
    sequence_features_only=True,
    cuts_long_sentences=True,
    tokenizer_flavor="electra",
    check=check_objective_settings,
    load_masking="electra",
)
