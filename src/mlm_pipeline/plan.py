"""Plan: from input paths to a list of tasks, before any data is processed.

The planner lists files and their sizes, learns each file's input format (set, or detected by
the registry in ``read``) and lets that format cut the file into pieces (nominal byte ranges
that its reader aligns on document boundaries, so the data is not read; whole compressed files;
Parquet row groups); small pieces are grouped so that a task is roughly ``split_bytes`` of input
(by default a size derived from the total input, ``auto_split_bytes``). Task ids and seeds come from the plan order alone —
never from worker count or scheduling — so any executor reproduces the same shards. The plan
order is the files' URL order, whatever order the inputs were named in (a reference mode keeps
the order given, as its reference script does).
"""

from __future__ import annotations

import hashlib
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from mlm_pipeline import fs
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.errors import ConfigError, InputError
from mlm_pipeline.instances import get_objective
from mlm_pipeline.languages import file_languages, label_pieces
from mlm_pipeline.read import InputSample, Piece, ReadOptions, detect_format, get_input_format
from mlm_pipeline.read.wikitext_dataset import looks_like_wikitext

log = logging.getLogger("mlm_pipeline")

WARNED_FILES = 10
"""Skipped inputs named in a warning each; the rest are counted in one."""


@dataclass(frozen=True)
class Task:
    task_id: str
    index: int
    pieces: tuple[Piece, ...]
    input_bytes: int
    count: int = 1  # tasks in the plan (not part of the task's identity: left out of to_dict)
    # --language-alpha: (language, how many times its documents are used on average), from the
    # counting pass (languages.sample_plan); derived from the input, so left out of to_dict too
    language_rates: tuple[tuple[str, float], ...] = ()

    def seed_sequence(self, random_seed: int, *extra: int) -> np.random.SeedSequence:
        """Seed from (global seed, task index[, block index...]) only."""
        return np.random.SeedSequence(random_seed, spawn_key=(self.index, *extra))

    def describe(self) -> str:
        return "; ".join(p.describe() for p in self.pieces)

    def to_dict(self) -> dict:
        return {"task_id": self.task_id, "pieces": [p.to_dict() for p in self.pieces], "input_bytes": self.input_bytes}


MIB = 1 << 20
AUTO_TASKS = 256
AUTO_MIN_BYTES = 4 * MIB
AUTO_MAX_BYTES = 64 * MIB


MAX_TASKS = 1_000_000
"""The most tasks a plan may hold. Each costs a marker, a line of ``_plan.json`` and ``_run.json``
(about 500 bytes together) and a few milliseconds; a million cover 64 TiB at the largest
``auto`` size. ``--split-size 1`` made 1.1 MB of input 1.1 million tasks."""


def _check_task_count(tasks: int, total_bytes: int, split_bytes: int, given: bool, *, at_most: bool = False) -> None:
    """Refuse a plan of over ``MAX_TASKS`` tasks (``at_most``: the count is an upper estimate)."""
    if tasks <= MAX_TASKS:
        return
    size = f"--split-size {split_bytes:,} bytes" if given else f"--split-size auto ({split_bytes:,} bytes)"
    raise ConfigError(f"{size} cuts {total_bytes:,} bytes of input into {'about ' if at_most else ''}{tasks:,} "
                      f"tasks, more than {MAX_TASKS:,}: give a larger --split-size (tasks of "
                      f"{-(-total_bytes // MAX_TASKS):,} bytes or more)")


def auto_split_bytes(total_bytes: int) -> int:
    """Task size when none is set: the input cut in ``AUTO_TASKS`` (256) tasks, rounded up to a
    whole MiB, kept within 4 MiB and 64 MiB.

    A pool finishes when its last task does, so each worker needs several tasks for the tail to
    stay short: on 16 cores, 1 GB in 64 tasks ran 10.0x one worker, in 256 tasks 11.8x. Each
    task also costs a few milliseconds (its shard file and marker, its first block's check), so
    one worker on 2 cores ran 1 GB about 7% slower in 256 tasks than in 32
    (docs/performance.md). 4 MiB is the default processing block: a smaller task makes smaller
    blocks, and one worker took 2.33 s for 100 MB in 1 MiB blocks against 2.14 s in 4 MiB ones
    (benchmarks/results/block-sizes-100MB.txt). 64 MiB bounds what a lost task costs on a big
    corpus. The size depends on the input only, never on the worker count, so the output
    does not either.
    """
    per_task = -(-max(total_bytes, 1) // AUTO_TASKS)
    return min(AUTO_MAX_BYTES, max(AUTO_MIN_BYTES, -(-per_task // MIB) * MIB))


@dataclass
class Plan:
    """The tasks of a run, in plan order, and its input files. Not changed once made (the
    fingerprint is computed once)."""

    tasks: list[Task]
    files: list[dict]
    skipped_files: list[dict] = field(default_factory=list)
    split_bytes: int = 0  # the task size used (set or auto)
    language_tokens: dict[str, int] | None = None  # --language-alpha: the input's tokens per language
    _fingerprint: str | None = field(default=None, init=False, repr=False, compare=False)

    def fingerprint(self) -> str:
        """sha256 of the tasks as sorted-key JSON: what must match for a run to be resumed."""
        if self._fingerprint is None:
            blob = json.dumps([t.to_dict() for t in self.tasks], sort_keys=True).encode()
            self._fingerprint = hashlib.sha256(blob).hexdigest()
        return self._fingerprint

    @property
    def input_bytes(self) -> int:
        return sum(t.input_bytes for t in self.tasks)


def plan_tasks(config: PrepareConfig) -> Plan:
    """Tasks for the configured inputs. Raises ``InputError`` for inputs that cannot be used."""
    options = ReadOptions.from_config(config)
    unlisted: list[dict] = []  # in a directory, what cannot be read (broken links, loops)
    listed = fs.list_inputs(config.inputs, unlisted)
    # ``prepare data/ -o data/out``: what a listing finds inside the output is never input (a file
    # named as an input is, wherever it lies)
    in_output, named = fs.inside(config.output, config.inputs), {fs.listed_url(i) for i in config.inputs}
    kept = [(url, size) for url, size in listed if url in named or not in_output(url)]
    if len(kept) < len(listed):
        log.info("leaving out the files inside the output %s", config.output)
        listed = kept
        if not listed:
            raise InputError(f"no input found: every file of {', '.join(config.inputs)} is inside the output "
                             f"{config.output}")
    reference = get_objective(config.objective).reference if config.reference else None
    if reference is None:
        # output depends on the input bytes, not on the order inputs are named in: files in URL order
        # (a reference mode keeps the order given, as the reference script reads its inputs)
        listed = sorted(listed)
    usable, skipped = usable_inputs([url for url, _ in listed], config.input_format, options, sizes=dict(listed))
    skipped = unlisted + skipped
    warn_skipped(skipped)
    # (objectives that cut a sentence longer than an instance: NSP's pairs, ELECTRA's examples)
    objective = get_objective(config.objective)
    paragraph_files = [f for f in usable if f.paragraph_lines] if objective.cuts_long_sentences else []
    if paragraph_files:
        first = paragraph_files[0]
        cost = ("most pairs would be random-next and long lines truncated" if objective.has_nsp_labels else
                "the tokens of a line past what fits in an example would be dropped")
        log.warning("%d of %d text inputs look like a paragraph per line (%s: %s); each line is taken as one "
                    "sentence, so %s: --sentence-split splits lines into sentences",
                    len(paragraph_files), sum(f.fmt == "text" for f in usable), first.url, first.paragraph_lines, cost)
    wikitext_files = [f for f in usable if f.wikitext_like]
    if wikitext_files:
        log.warning("%d text input(s) look like WikiText-2/-103 files (%s starts with an article title); "
                    "--input-format wikitext reads them an article per document, with headings dropped "
                    "and paragraphs split into sentences (as text, each paragraph is a document)",
                    len(wikitext_files), wikitext_files[0].url)
    if reference is not None and (other := [f for f in usable if f.fmt != "text"]):
        raise InputError(f"--reference reads plain text line by line, as its reference script does; {other[0].url} "
                         f"is read as {other[0].fmt}" + (f" (and {len(other) - 1} more)" if len(other) > 1 else "")
                         + ": give text extracted from it, or --input-format text to read its raw lines as the script "
                           "would (markup included), or leave out --reference")
    total_bytes = sum(f.size for f in usable)
    split_bytes = config.split_bytes or auto_split_bytes(total_bytes)
    # before cutting: pieces of about split_bytes each would not fit in memory either
    _check_task_count(total_bytes // split_bytes, total_bytes, split_bytes, config.split_bytes is not None,
                      at_most=True)
    files: list[dict] = []
    pieces: list[tuple[Piece, int]] = []
    labels = file_languages(config, [(f.url, f.size) for f in usable])
    for f in usable:
        plugin = get_input_format(f.fmt)
        # reference mode reads each file whole, like the reference script
        file_pieces = plugin.split(f.url, f.size, f.size if reference is not None else split_bytes, options)
        file_pieces = label_pieces(file_pieces, None if labels is None else labels.get(f.url))
        files.append({"path": f.url, "bytes": f.size, "format": f.fmt, "pieces": len(file_pieces)})
        if labels is not None and f.url in labels:
            files[-1]["language"] = labels[f.url]
        if f.side_files:
            files[-1]["side_files"] = list(f.side_files)
        pieces.extend((p, plugin.piece_bytes(p, f.size, len(file_pieces))) for p in file_pieces)
    # a reference mode's unit: one task per file, or the whole corpus in one task
    unit = reference.unit if reference is not None else None
    if unit == "file" and len(files) > 1:
        log.warning("--reference with %d input files writes, for each, what the reference script writes for that "
                    "file alone; one run of the script over the whole list pools their documents (it draws "
                    "random-next segments across files), so its output differs", len(files))
    task_bytes = sum(nbytes for _, nbytes in pieces) if unit == "corpus" else split_bytes
    tasks = _group(pieces, task_bytes, one_piece_per_task=unit == "file")
    _check_task_count(len(tasks), total_bytes, split_bytes, config.split_bytes is not None)
    tasks = [replace(t, count=len(tasks)) for t in tasks]
    if not tasks:
        detail = ", ".join(f"{s['path']} ({s.get('detail', s['reason'])})" for s in skipped)
        raise InputError("no usable input: every input file was skipped: " + detail)
    return Plan(tasks=tasks, files=files, skipped_files=skipped, split_bytes=split_bytes)


class _Input(NamedTuple):
    url: str
    size: int
    fmt: str
    side_files: tuple[str, ...]
    paragraph_lines: str | None = None  # text format: why its lines look like paragraphs
    wikitext_like: bool = False  # text format: its first line is like a WikiText article title


SNIFF_THREADS = 32
"""Inputs on an object store sniffed at once: each sniff is a request (tens of ms), and a
corpus of 100,000 files sniffed one by one would plan for half an hour at 20 ms a request. (The
client may allow fewer: s3fs keeps 10 connections unless configured otherwise.)"""


def warn_skipped(skipped: list[dict], more: str = "listed with their reasons in the manifest") -> None:
    """A warning per skipped input (of :func:`usable_inputs`), the first ``WARNED_FILES`` of them."""
    noted = [s for s in skipped if s["reason"] != "side_file"]  # a side file is read with its main file
    for s in noted[:WARNED_FILES]:
        log.warning("skipping %s (%s): %s", s["path"], s["reason"], s.get("detail", "an empty file"))
    if len(noted) > WARNED_FILES:
        log.warning("skipping %d more inputs (%s)", len(noted) - WARNED_FILES, more)


def usable_inputs(
    urls: list[str], input_format: str, options: ReadOptions, *, sizes: dict[str, int] | None = None
) -> tuple[list[_Input], list[dict]]:
    """The inputs to read, and the skipped ones with their reason: ``empty_file``, ``binary``
    (the format's binary check), ``vocabulary`` (a tokenizer's vocab.txt under a text format),
    ``wiki_index`` (a Wikipedia multistream index under a text format) or ``side_file`` (read by another input, such as a dump's index). ``sizes`` (from the listing)
    spares a metadata request per file.

    Remote inputs are sniffed ``SNIFF_THREADS`` at a time; the result, and the error raised for
    an unreadable input (the first in input order), are those of a sniff one by one.
    """
    def sniff(part: list[str]) -> list[_Input | dict]:
        return [_sniff(url, None if sizes is None else sizes.get(url), input_format, options) for url in part]

    if len(urls) > 1 and not all(fs.is_local(u) for u in urls):
        pool = ThreadPoolExecutor(SNIFF_THREADS, thread_name_prefix="sniff")
        try:  # 64 inputs a job: a future per input costs as much as a sniff
            parts = pool.map(sniff, [urls[i:i + 64] for i in range(0, len(urls), 64)])
            sniffed = [f for part in parts for f in part]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    else:
        sniffed = sniff(urls)
    usable = [f for f in sniffed if isinstance(f, _Input)]
    skipped = [f for f in sniffed if isinstance(f, dict)]
    read_by = {side: f.url for f in usable for side in f.side_files}
    skipped = [{"path": f["path"], "reason": "side_file", "detail": f"read with {read_by[f['path']]}"}
               if f["path"] in read_by else f for f in skipped]  # (a dump's index, found beside it)
    for f in usable:
        if f.url in read_by:
            skipped.append({"path": f.url, "reason": "side_file", "detail": f"read with {read_by[f.url]}"})
    return [f for f in usable if f.url not in read_by], skipped


def _sniff(url: str, size: int | None, input_format: str, options: ReadOptions) -> _Input | dict:
    """One input, ready to plan, or its skip record."""
    try:
        if size is None:
            size = fs.file_size(url)
    except (OSError, PermissionError) as exc:
        raise InputError(f"cannot read {url}: {exc}") from exc
    if size == 0:
        return {"path": url, "reason": "empty_file"}
    sample = InputSample(url, size)
    try:
        fmt = detect_format(sample) if input_format == "auto" else input_format
        reason = get_input_format(fmt).binary_reason(sample)
    except PermissionError as exc:
        raise InputError(f"cannot read {url}: permission denied") from exc
    except OSError as exc:
        raise InputError(f"cannot read {url}: {exc}") from exc
    if reason:
        return {"path": url, "reason": "binary", "detail": reason}
    paragraphs, wikitext_like = None, False
    if fmt == "text":  # a vocab.txt caught by a glob is text to every other check
        reason = sample.vocabulary_reason()
        if reason:
            return {"path": url, "reason": "vocabulary", "detail": reason}
        reason = sample.wiki_index_reason()
        if reason:
            return {"path": url, "reason": "wiki_index", "detail": reason}
        # (with --sentence-split, lines read as sentences are the user's choice: no hints)
        if not options.sentence_split:
            paragraphs, wikitext_like = sample.paragraph_lines(), looks_like_wikitext(sample.first_line())
    return _Input(url, size, fmt, get_input_format(fmt).side_files(url, options), paragraphs, wikitext_like)


def _group(pieces: list[tuple[Piece, int]], split_bytes: int, *, one_piece_per_task: bool) -> list[Task]:
    """Consecutive pieces grouped into tasks of up to ``split_bytes`` input bytes (a bigger
    piece is a task alone), in plan order; ids and indices count from 0."""
    tasks: list[Task] = []
    group: list[Piece] = []
    group_bytes = 0

    def flush() -> None:
        nonlocal group, group_bytes
        if group:
            idx = len(tasks)
            tasks.append(Task(task_id=f"{idx:05d}", index=idx, pieces=tuple(group), input_bytes=group_bytes))
        group, group_bytes = [], 0

    for piece, nbytes in pieces:
        if group and (one_piece_per_task or group_bytes + nbytes > split_bytes):
            flush()
        group.append(piece)
        group_bytes += nbytes
    flush()
    return tasks
