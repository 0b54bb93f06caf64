"""A run's state on disk: start, check, resume, and the completion markers.

State lives in the output itself (names in :mod:`.layout`), so any machine can resume a run and
any number of workers can share one:

* ``_run.json`` is written first, by a conditional create: of workers starting together one
  writes it, the others compare. A run with other output settings, another tokenizer, changed
  inputs or another :data:`ALGORITHM` is refused rather than mixed.
* ``_plan.json`` holds the tasks and input files, so ``finalize`` needs only the output.
* ``_tasks/TASK.json``, a task's marker, is written last by whoever ran the task: a task is done
  when its marker and every shard it lists exist. A task without one is redone from scratch.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable

from mlm_pipeline import __version__, cas, fs
from mlm_pipeline.config import (PrepareConfig, build_config, by_content_names, flag_for, settings_as_recorded_now,
                                 settings_of)
from mlm_pipeline.errors import ConfigError, OutputError
from mlm_pipeline.masking.registry import check_tokenizer, warn_capped_rate
from mlm_pipeline.plan import Plan, Task, plan_tasks
from mlm_pipeline.read import get_input_format
from mlm_pipeline.read.base import Piece, ReadOptions
from mlm_pipeline.run import layout
from mlm_pipeline.run.lock import refuse_a_file_as_output
from mlm_pipeline.stats import add_counts
from mlm_pipeline.tokenize import case_mismatch, load_tokenizer, missing_unk_message
from mlm_pipeline.formats import get_output_format, sink
from mlm_pipeline.instances import get_objective

log = logging.getLogger("mlm_pipeline")

ALGORITHM = 7
"""Version of the default-mode tasks, blocks, instance building, shuffling and masking: the same settings and
seed give the same bytes only under the same version, so a run started under another is not resumed (2:
instances shuffled as they are built, before masking; 3: ``block_bytes`` counts the UTF-8 bytes of the text,
not its characters, so blocks of non-ASCII text end elsewhere; 4: ``--split-size auto`` cuts the input in 256
tasks of at least 4 MiB, not 32 of at least 1 MiB; 5: a document longer than ``block_bytes`` is cut into parts
of that size, not of 64 MiB; 6: a Wikipedia dump's reference sections and citation list items are dropped
unless ``--wiki-keep-references``; 7: masking chunks are bounded in cells, not rows, so ``ngram`` and
``span`` draw in another order where rows exceed 512 words or span budgets 120 tokens)."""

TOKENIZATION = {"reference": 2, "electra": 2}
"""Versions of the tokenizations that changed while the tokenizer's fingerprint did not, recorded by
the runs that use them: ``reference``, ``--reference`` (2: characters classed, lower-cased and put
in NFD by Python's tables, as Google's tokenizer does, where 1 kept HF's on all but private-use
characters), and ``electra``, the ``electra`` flavor (2: runs of marks ordered by Python's
combining classes). A run recorded under another version is not resumed, so no output mixes two."""


def _tokenizations(config: PrepareConfig, flavor: str) -> dict[str, int]:
    used = {"reference": config.reference, "electra": flavor == "electra"}
    return {name: version for name, version in TOKENIZATION.items() if used[name]}


class CompletedTasks:
    """The completed tasks of a run, with what the manifest needs of their markers: each task's
    shards, the sum of the tasks' stats, and which tokenizer backend encoded how many tasks.

    Whole markers are not kept: parsed, one holds about 20 KB (its stats' histograms), 4 GB for
    the 200,000 tasks of a 10 TB corpus. ``task_id in completed`` and ``len`` ask what is done.
    """

    def __init__(self, plan: Plan) -> None:
        self._index = {t.task_id: t.index for t in plan.tasks}
        self._shards: dict[int, list[dict]] = {}  # plan index -> the task's shards
        self._times: dict[int, dict] = {}  # plan index -> when and how fast the task ran
        self._stats: dict = {}
        self._backends: Counter[str] = Counter()
        self._fast: set[int] = set()  # plan indices of the tasks a backend other than the reference encoded
        self.reference = "hf"  # the backend every other is checked against (sentencepiece for a .model)
        self._fell_back: str | None = None  # a task whose own text showed the fast backend differing from HF
        self.rejected: dict[str, bytes] = {}  # task id -> the bytes of its marker, read and found stale

    @classmethod
    def of(cls, plan: Plan, markers: Iterable[dict]) -> CompletedTasks:
        done = cls(plan)
        for marker in markers:
            done.add(marker)
        return done

    def add(self, marker: dict) -> None:
        """Count a task's marker (a task counted already is not counted twice)."""
        index = self._index.get(marker["task_id"])
        if index is None:
            raise ValueError(f"task {marker['task_id']!r} is not in this run's plan")
        if index in self._shards:
            return
        self._shards[index] = marker["shards"]
        self._times[index] = task_timing(marker)
        add_counts(self._stats, marker["stats"])
        backend = marker.get("tokenizer_backend", {})
        self._backends[json.dumps(backend, sort_keys=True)] += 1
        self.reference = backend.get("reference", "hf")  # sentencepiece for a SentencePiece model
        if backend.get("backend", "hf") != self.reference:
            self._fast.add(index)
        if backend.get("fallback_from") and self._fell_back is None:
            self._fell_back = marker["task_id"]

    def __contains__(self, task_id: object) -> bool:
        return self._index.get(task_id) in self._shards  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._shards)

    def shards(self) -> list[dict]:
        """Every shard, in task order (the plan's), each task's in its own order."""
        return [s for index in sorted(self._shards) for s in self._shards[index]]

    def timings(self) -> list[dict]:
        """Each task's :func:`task_timing`, in plan order (what ``report`` plots per task)."""
        return [self._times[index] for index in sorted(self._times)]

    def stats(self) -> dict:
        """The tasks' stats summed; keys of nested counts (histograms, skip reasons) sorted, so the
        totals do not depend on the order tasks finished in."""
        return {k: _sorted_counts(v) if isinstance(v, dict) else v for k, v in self._stats.items()}

    @property
    def fell_back(self) -> str | None:
        """A task whose own text showed the fast backend differing from HF (it fell back to HF), if any."""
        return self._fell_back

    def encoded_fast(self) -> list[str]:
        """The ids of the tasks a backend other than the reference (``reference``) encoded, in plan order."""
        ids = {index: task_id for task_id, index in self._index.items()}
        return [ids[index] for index in sorted(self._fast)]

    def backends(self) -> list[dict]:
        """Which tokenizer backend encoded how many tasks (and why any fell back to HF)."""
        return [{**json.loads(k), "tasks": n} for k, n in sorted(self._backends.items())]


def task_timing(marker: dict) -> dict:
    """A task's start (seconds since the epoch; None in markers of older versions), its seconds,
    the input bytes it read, its tokens and its instances."""
    stats = marker.get("stats", {})
    return {"task_id": marker["task_id"], "started": marker.get("started"), "seconds": marker.get("seconds"),
            "bytes_read": stats.get("bytes_read", 0), "tokens": stats.get("tokens", 0),
            "instances": stats.get("instances", 0)}


def _sorted_counts(counts: dict) -> dict:
    def key(k: str) -> tuple:  # (ASCII digits only: a token such as "²" is a digit to isdigit, not to int)
        return (0, int(k), "") if k.lstrip("-").isascii() and k.lstrip("-").isdigit() else (1, 0, k)

    return {k: _sorted_counts(counts[k]) if isinstance(counts[k], dict) else counts[k] for k in sorted(counts, key=key)}


@dataclass
class RunStart:
    """What a driver needs before running tasks: the plan, the run record, the completed tasks."""

    plan: Plan
    record: dict
    done: CompletedTasks

    @property
    def pending(self) -> list[Task]:
        return [t for t in self.plan.tasks if t.task_id not in self.done]


def start_run(config: PrepareConfig, *, clean: bool = True, dry_run: bool = False) -> RunStart:
    """Plan, check or record the run in ``_run.json``, save the plan, and find completed tasks.

    ``clean=False`` keeps ``_tmp/`` (other workers may be writing there); ``dry_run``: the checks
    and the plan only, the output neither read nor written (``prepare --dry-run``)."""
    # fail early on a bad tokenizer or backend name
    tok = load_tokenizer(config.tokenizer, config.do_lower_case, config.tokenizer_flavor,
                         backend=config.tokenizer_backend)
    if tok.missing_unk:
        log.warning("%s", missing_unk_message(config.tokenizer, tok.missing_unk, "a word its vocabulary cannot "
                                              "spell will stop the run's task there"))
    if (mismatch := case_mismatch(tok, lower_off=flag_for("do_lower_case", False))) is not None:
        log.warning("%s", mismatch)
    elif "do_lower_case" in config.model_fields_set and tok.kind == "tokenizer.json":
        log.warning("--do-lower-case/--no-do-lower-case has no effect with %s: a tokenizer.json lower-cases "
                    "or not by its own normalizer", config.tokenizer)
    if config.reference and (check := get_objective(config.objective).reference.tokenizer_warning) is not None:
        if (warning := check(tok)) is not None:
            log.warning("%s", warning)
    check_tokenizer(config, tok)
    # (with dynamic masking at load time, the loader masks with the scheme the manifest records)
    if (scheme := config.masking_scheme) != "token" and config.masking != "static" \
            and get_objective(config.objective).load_masking != "dynamic":
        log.warning("%s has no effect with --masking %s: the shards hold no masks, and the loader masks them "
                    "with the objective's own masking", "--do-whole-word-mask" if scheme == "whole-word"
                    else f"--masking-scheme {scheme}", config.masking)
    warn_capped_rate(config)
    plan = plan_tasks(config)
    if config.num_out_files is not None and config.num_out_files < len(plan.tasks):
        raise ConfigError(
            f"--num-out-files {config.num_out_files} is fewer than the run's {len(plan.tasks)} tasks (each task "
            f"writes its own files): give at least {len(plan.tasks)}, or a larger --split-size"
        )
    if dry_run:
        return RunStart(plan=plan, record={}, done=CompletedTasks(plan))
    record = run_record(config, tok.fingerprint, plan, tok.flavor)
    check_or_start_run(config, record, plan, replace_empty=clean)
    save_plan(config.output, plan, inputs=config.inputs)
    if clean:
        sink.clean_tmp(config.output)
    done = completed_tasks(config, plan)
    if done:
        log.info("resuming: %d of %d tasks already complete", len(done), len(plan.tasks))
    return RunStart(plan=plan, record=record, done=done)


INPUT_EXTENT = "read"
"""What a task's input fingerprint covers, recorded in ``_run.json``: ``read``, the bytes its reader
depends on (:meth:`~mlm_pipeline.read.base.InputFormat.read_extent`: a line-based range and the
rest of its last document past its end), sampled with where the range ends; records without the
key covered the range only, sampled with the file's size."""


def input_fingerprints(plan: Plan, *, full: bool = False, options: ReadOptions | None = None,
                       extents: dict | None = None) -> dict[str, str]:
    """Per task, a fingerprint of the input bytes it reads (:func:`~mlm_pipeline.fs.content_fingerprint`
    of each of its pieces: what a byte-range piece's reader depends on where its format knows it
    exactly (``read_extent`` under ``options``), else its range with the file's size, as earlier
    versions recorded every range (``options=None``); a whole file for other pieces, side files
    included); 32 files at a time on an object store. ``extents``: the pieces' extents found by
    an earlier call with the same ``options`` (filled in here), so that they are read once."""
    extents = {} if extents is None else extents

    def ranged(p: Piece) -> bool:
        return p.compression is None and get_input_format(p.fmt).unit == "bytes"

    def exact(p: Piece) -> bool:
        return options is not None and (full or fs.is_local(p.url))  # (an object's ETag covers it whole)

    by_file: dict[str, list[Piece]] = {}
    for p in (p for t in plan.tasks for p in t.pieces if ranged(p) and exact(p) and p not in extents):
        by_file.setdefault(p.url, []).append(p)
    for pieces in by_file.values():  # last to first: each search past a piece's end may stop at the next one's
        following, after = None, None
        for p in sorted(pieces, key=lambda p: p.start, reverse=True):
            found = get_input_format(p.fmt).read_extent(p, options, following if after == p.end else None)
            extents[p] = (p.start, p.end, True) if found is None else (*found, False)
            following, after = (None, None) if found is None else ((p.end, found[1]), p.start)

    def ranges(task: Task) -> list[tuple[str, int, int | None, bool]]:
        out = []
        for p in task.pieces:
            if ranged(p):
                out.append((p.url, *(extents[p] if exact(p) else (p.start, p.end, True))))
            else:
                out.append((p.url, 0, None, True))
            out += [(u, 0, None, True) for u in (p.extra or {}).get("side_files", [])]
        return out

    wanted = sorted({r for t in plan.tasks for r in ranges(t)}, key=lambda r: (r[0], r[1], r[2] or -1, r[3]))
    threads = 1 if all(fs.is_local(r[0]) for r in wanted) else 32
    with ThreadPoolExecutor(threads) as pool:
        fps = dict(zip(wanted, pool.map(lambda r: fs.content_fingerprint(r[0], start=r[1], end=r[2], full=full,
                                                                         file_size=r[3]),
                                        wanted)))
    return {t.task_id: hashlib.sha256("\n".join(fps[r] for r in ranges(t)).encode()).hexdigest()
            for t in plan.tasks}


def run_record(config: PrepareConfig, tokenizer_fp: str, plan: Plan, flavor: str = "bert") -> dict:
    """The content of ``_run.json``: what must match for a run to be resumed (``flavor``: the
    tokenizer's, as loaded)."""
    options = ReadOptions.from_config(config)
    record = {
        "version": __version__,
        "algorithm": ALGORITHM,
        "settings": config.output_settings(),
        "output_fingerprint": config.output_fingerprint(),
        "tokenizer_fingerprint": tokenizer_fp,
        "plan_fingerprint": plan.fingerprint(),
        "tasks": len(plan.tasks),
        "input_extent": INPUT_EXTENT,
        "input_fingerprints": input_fingerprints(plan, options=options, extents=(extents := {})),
        "input_modified": {f["path"]: fs.modified_ns(f["path"]) for f in plan.files},
    }
    if tokenizations := _tokenizations(config, flavor):
        record["tokenization"] = tokenizations
    record["shard_layout"] = get_output_format(config.format).layout_version
    if config.verify_inputs:
        record["input_sha256"] = input_fingerprints(plan, full=True, options=options, extents=extents)
    return record


def check_or_start_run(config: PrepareConfig, record: dict, plan: Plan | None = None, *,
                       replace_empty: bool = False) -> None:
    """Write ``_run.json`` if absent; else raise :class:`OutputError` listing everything that
    differs: settings, algorithm, tokenizer (by content), input files (``plan``'s against the
    existing ``_plan.json``) and the inputs' content.

    ``replace_empty``: a run with other settings that completed no task (it failed or was stopped
    before any) or read no document is replaced instead (only where no other worker can be using
    the output).
    """
    url = layout.run_url(config.output)
    refuse_a_file_as_output(config.output)
    try:
        existing = json.loads(fs.read_bytes(url)) if fs.exists(url) else None
    except (OSError, json.JSONDecodeError) as exc:
        raise OutputError(f"cannot read {url}: {exc}") from exc
    if existing is None:
        foreign = _files_of_no_run(config.output)
        if foreign and not fs.exists(url):  # (a worker starting with this one may have recorded the run since)
            raise OutputError(
                f"the output {config.output} holds {' and '.join(foreign)} but no {layout.RUN_FILE}: files of no "
                "run that can be resumed, which would mix with this run's (a glob over its shards would read them); "
                "use a new --output or remove them")
        try:  # a conditional create: of workers starting together, one writes it, the others compare
            if cas.create_bytes(url, _record_bytes(record)):
                return
            existing = json.loads(fs.read_bytes(url))
        except OSError as exc:
            raise OutputError(f"cannot write to output {config.output}: {exc.strerror or exc}") from exc
    problems = []
    old, new = settings_as_recorded_now(existing.get("settings", {})), record["settings"]
    label = {s.name: s.label for s in settings_of(PrepareConfig)}  # as the flags name them
    for key in sorted((set(old) | set(new)) - by_content_names()):  # a tokenizer is compared by content below
        if old.get(key) != new.get(key):
            name = label.get(key, key.replace("_", "-"))
            problems.append(f"{name}: {_shown(key, old.get(key))} in the existing run, {_shown(key, new.get(key))} now")
    if existing.get("algorithm", 1) != record["algorithm"]:
        problems.append(
            f"the existing run was made by a version that builds other instances (algorithm "
            f"{existing.get('algorithm', 1)}, now {record['algorithm']}): finish it with that version"
        )
    # a tokenization the existing run used too (a switch of --reference or of the tokenizer is
    # reported as such), in another version
    used_too = {"reference": old.get("reference"),
                "electra": existing.get("tokenizer_fingerprint") == record["tokenizer_fingerprint"]}
    for name, version in record.get("tokenization", {}).items():
        if used_too[name] and (was := existing.get("tokenization", {}).get(name, 1)) != version:
            problems.append(f"the existing run was made by a version that tokenizes otherwise ({name} tokenization "
                            f"{was}, now {version}): finish it with that version")
    if old.get("format") == config.format and (was := existing.get("shard_layout", 1)) != record["shard_layout"]:
        problems.append(f"the existing run was made by a version that lays out {config.format} shards otherwise "
                        f"(layout {was}, now {record['shard_layout']}): finish it with that version")
    if existing.get("tokenizer_fingerprint") != record["tokenizer_fingerprint"]:
        problems.append("the tokenizer differs from the one the existing run used")
    repaired = ""
    if existing.get("plan_fingerprint") != record["plan_fingerprint"]:
        changed = _input_changes(config.output, plan)
        if (replace_empty and not problems and _only_unfinished_tasks_differ(config.output, plan)
                and not _changed_inputs(config.output, existing, record, plan)):
            repaired = changed or "other pieces"  # (a plain run: no other worker uses this plan)
        elif changed or not problems:  # else the settings listed above explain the other plan
            problems.append("the input files changed since the existing run started"
                            + (f": {changed}" if changed else " (different files or sizes)"))
    if not problems and not repaired:
        problems += _changed_inputs(config.output, existing, record, plan)
    if repaired:
        log.warning("the input files changed since the run started (%s), but only in tasks not completed yet: "
                    "they read the files as they are now", repaired)
        # the new plan first: a run stopped between the two finds it, and takes the repair again
        save_plan(config.output, plan, inputs=config.inputs, replace=True)
        fs.atomic_write_bytes(url, _record_bytes(record))
        return
    if problems and replace_empty and _read_nothing(config.output):
        log.warning("replacing the run in %s: it completed no task, or read no document (%s)", config.output,
                    "; ".join(problems))
        fs.remove(layout.plan_url(config.output))
        fs.remove(layout.manifest_url(config.output))
        # its markers, and the shards of its tasks (stopped ones committed some, too)
        for directory in (layout.tasks_url(config.output), *layout.shard_dir_urls(config.output)):
            fs.remove_tree(directory)
        fs.atomic_write_bytes(url, _record_bytes(record))
        return
    if problems:
        raise OutputError(
            f"{config.output} already holds a run with other settings; use a new --output or remove it.\n  "
            + "\n  ".join(problems)
        )


def _record_bytes(record: dict) -> bytes:
    """``_run.json`` as written (made only when it is: a 10 TB run's record holds 200,000 fingerprints)."""
    return json.dumps(record, indent=1, sort_keys=True).encode()


def _only_unfinished_tasks_differ(output: str, plan: Plan | None) -> bool:
    """``plan`` has as many tasks as the saved one and differs only in tasks without a marker:
    a damaged input (a truncated .gz, say) repaired after its task failed changes its size and
    so its task, while every completed task reads what it read before."""
    try:
        saved = json.loads(fs.read_bytes(layout.plan_url(output)))["tasks"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if plan is None or len(saved) != len(plan.tasks):
        return False
    done = done_task_ids(output)
    now = json.loads(json.dumps([t.to_dict() for t in plan.tasks]))
    return all(old == new for old, new in zip(saved, now) if old.get("task_id") in done)


def _shown(key: str, value) -> str:
    """A setting's value as a refusal shows it: ``auto`` for the split size chosen from the input."""
    return "auto" if key == "split_bytes" and value is None else repr(value)


def _files_of_no_run(output: str) -> list[str]:
    """What of a run's own names an output without ``_run.json`` holds: shard files, a manifest,
    markers (every run writes ``_run.json`` before them, so they are another run's, or not ours)."""
    found = [f"{len(names)} file(s) in {url.rstrip('/').rsplit('/', 1)[-1]}/"
             for url in (*layout.shard_dir_urls(output), layout.tasks_url(output)) if (names := fs.listdir(url))]
    if fs.exists(layout.manifest_url(output)):
        found.append(layout.MANIFEST_FILE)
    return found


def _read_nothing(output: str) -> bool:
    """The run in ``output`` completed no task, or its tasks read no document (the wrong
    --text-field, blank inputs): nothing of it is worth keeping against new settings."""
    try:  # a finished run that read documents is kept, whatever its markers say (a copy without _tasks/)
        if json.loads(fs.read_bytes(layout.manifest_url(output)))["totals"].get("documents_read", 0):
            return False
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError):
        return False  # cannot tell: keep it
    ids = sorted(done_task_ids(output))
    for data in fs.read_many([layout.marker_url(output, i) for i in ids]):
        if data is None:
            return False  # not read (a storage error, or gone since the listing): cannot tell, keep it
        try:
            stats = json.loads(data)["stats"]
        except (ValueError, KeyError, TypeError):
            return False  # cannot tell: keep it
        if stats.get("documents_read", 0) or stats.get("instances", 0):
            return False
    return True


def _changed_inputs(output: str, existing: dict, record: dict, plan: Plan | None) -> list[str]:
    """The completed tasks whose input bytes changed since the existing run recorded them (by each
    kind of fingerprint both records hold; a record without them, from an older version, is
    trusted). A task not completed yet reads the inputs as they are now, so an input may be
    repaired where a task failed on it."""
    done = done_task_ids(output)
    describe = {t.task_id: t.describe() for t in plan.tasks} if plan is not None else {}
    for key, how in (("input_fingerprints", "sampled blocks or ETag"), ("input_sha256", "SHA-256 of its bytes")):
        old, new = existing.get(key), record.get(key)
        if old is None or new is None:
            continue
        if existing.get("input_extent") != record.get("input_extent") and plan is not None:
            new = input_fingerprints(plan, full=key == "input_sha256")  # a record of ranges only: compare those
        changed = sorted(t for t in done if t in old and old.get(t) != new.get(t))
        if changed:
            shown = "; ".join(f"task {t} ({describe.get(t, '?')})" for t in changed[:5])
            more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
            return [f"the input bytes of completed tasks changed since the existing run started ({how}): "
                    f"{shown}{more}"]
    if record.get("input_sha256") is not None and existing.get("input_sha256") is None:
        log.warning("--verify-inputs: the existing run recorded no SHA-256 of its inputs; checked by sampled "
                    "blocks only")
    old_m, new_m = existing.get("input_modified") or {}, record.get("input_modified") or {}
    touched = sorted(u for u in new_m if u in old_m and old_m[u] != new_m[u])
    if touched:
        log.warning("%s modified since the run started; the parts that completed tasks read show no change "
                    "(sampled blocks%s): those tasks are kept, the others read the files as they are now",
                    ", ".join(touched[:5]) + (" ..." if len(touched) > 5 else ""),
                    "" if record.get("input_sha256") else "; --verify-inputs compares every byte")
    return []


def _input_changes(output: str, plan: Plan | None, shown: int = 5) -> str:
    """The input files added, removed or resized since ``output``'s plan was saved, in words;
    "" when the files and sizes are the same (or the saved plan cannot be read)."""
    try:
        before = {f["path"]: f["bytes"] for f in json.loads(fs.read_bytes(layout.plan_url(output)))["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    now = {f["path"]: f["bytes"] for f in plan.files} if plan is not None else before

    def named(paths: list[str]) -> str:
        return ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if len(paths) > shown else "")

    parts = []
    if added := sorted(set(now) - set(before)):
        parts.append(f"new {named(added)}")
    if removed := sorted(set(before) - set(now)):
        parts.append(f"gone {named(removed)}")
    if resized := sorted(p for p in set(now) & set(before) if now[p] != before[p]):
        parts.append("resized " + named([f"{p} ({before[p]:,} -> {now[p]:,} bytes)" for p in resized]))
    return "; ".join(parts)


def save_plan(output: str, plan: Plan, inputs: list[str] | None = None, *, replace: bool = False) -> None:
    """Write ``_plan.json`` once (the same plan gives the same bytes, so a racing writer is harmless);
    ``replace``: over the one there (a repaired input's new plan).

    ``inputs``: the run's inputs as given (a reference mode may read a directory as a whole).
    Compact JSON, one line per task: ``indent`` would send the encoding through Python's slow
    encoder (seconds for the 200,000 tasks of a 10 TB plan) and double the file.
    """
    url = layout.plan_url(output)
    if not replace and fs.exists(url):
        return
    doc = {"plan_fingerprint": plan.fingerprint(), "files": plan.files, "skipped_files": plan.skipped_files,
           "split_bytes": plan.split_bytes}
    if inputs is not None:
        doc["inputs"] = list(inputs)
    head = json.dumps(doc, sort_keys=True)
    tasks = ",\n".join(json.dumps(t.to_dict(), sort_keys=True) for t in plan.tasks)
    fs.atomic_write_bytes(url, f'{head[:-1]}, "tasks": [\n{tasks}\n]}}\n'.encode())


def load_run(output: str) -> tuple[PrepareConfig, dict, Plan]:
    """The config, run record and plan that ``prepare`` stored in an output."""
    layout.refuse_a_file(output)
    try:
        record = json.loads(fs.read_bytes(layout.run_url(output)))
        plan_doc = json.loads(fs.read_bytes(layout.plan_url(output)))
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{output} holds no run of mlm-pipeline prepare ({exc})") from None
    tasks = [Task(task_id=t["task_id"], index=i, pieces=tuple(Piece(**p) for p in t["pieces"]),
                  input_bytes=t["input_bytes"], count=len(plan_doc["tasks"])) for i, t in enumerate(plan_doc["tasks"])]
    plan = Plan(tasks=tasks, files=plan_doc["files"], skipped_files=plan_doc["skipped_files"],
                split_bytes=plan_doc.get("split_bytes", 0))
    inputs = plan_doc.get("inputs") or [f["path"] for f in plan.files] or [s["path"] for s in plan.skipped_files]
    config = build_config({**record["settings"], "inputs": inputs, "output": output})
    return config, record, plan


def write_marker(output: str, marker: dict) -> None:
    """Mark a task complete: called last by whoever ran it, after its shards are committed.

    Compact JSON: with ``indent`` Python encodes in pure Python, 0.25 ms for a marker with its
    token counts against 0.07 ms (benchmarks/results/marker-json.txt), once per task; ``jq .``
    shows one indented."""
    fs.atomic_write_bytes(layout.marker_url(output, marker["task_id"]),
                          json.dumps(marker, separators=(",", ":")).encode())


def done_task_ids(output: str) -> set[str]:
    """Ids of the tasks that have a marker (a fresh listing, one LIST on an object store)."""
    ids = (layout.task_id_of(p) for p in fs.listdir(layout.tasks_url(output)))
    return {i for i in ids if i is not None}


def completed_tasks(config: PrepareConfig, plan: Plan) -> CompletedTasks:
    """The tasks done under this config: marker present and readable, made with these output
    settings, and every shard it lists present with the size the marker records (a truncated
    shard makes its task run again; the listing gives the sizes, so this costs nothing). The markers are read in batches (``fs.read_many``)."""
    names = done_task_ids(config.output)
    shard_sizes = {name: size for d in layout.shard_dir_urls(config.output) for name, size in fs.list_sizes(d).items()}
    fingerprint = config.output_fingerprint()  # (milliseconds with many inputs: once, not per marker)
    ids = [t.task_id for t in plan.tasks if t.task_id in names]
    done = CompletedTasks(plan)
    for task_id, data in zip(ids, fs.read_many([layout.marker_url(config.output, i) for i in ids])):
        if data is None:
            continue  # not read (gone since the listing, or a storage error): redo the task, keep the file
        try:
            marker = json.loads(data)
        except json.JSONDecodeError:
            marker = None
        if not isinstance(marker, dict) or marker.get("output_fingerprint") != fingerprint:
            done.rejected[task_id] = data  # damaged, or made with other settings: redo the task
            continue
        bad = [f["path"] for s in marker["shards"] for f in layout.shard_files(s)
               if shard_sizes.get(f["path"].rsplit("/", 1)[-1]) != f["bytes"]]
        if bad:  # a shard missing, or of another size than its task wrote (truncated): redo the task
            log.warning("task %s is not done (prepare runs it again): shard %s is %s", marker["task_id"], bad[0],
                        "missing" if bad[0].rsplit("/", 1)[-1] not in shard_sizes else
                        f"{shard_sizes[bad[0].rsplit('/', 1)[-1]]} bytes, its marker says {_bytes_of(marker, bad[0])}")
            done.rejected[task_id] = data
            continue
        done.add(marker)
    return done


def forget_rejected(output: str, done: CompletedTasks, task_ids: Iterable[str] | None = None) -> None:
    """Delete the markers :func:`completed_tasks` read and found stale (of ``task_ids`` only, when
    given: an array worker's own share), so that a marker's presence means the same to every
    worker as a checked marker: claim workers skip any task that has one, and would otherwise never
    redo a task whose shard was lost, while no manifest could be written.

    A marker is read again first and deleted only if it is still the one found stale: another
    worker may have redone the task and written a valid one since."""
    wanted = None if task_ids is None else set(task_ids)
    stale = {t: data for t, data in done.rejected.items() if wanted is None or t in wanted}
    urls = [layout.marker_url(output, t) for t in stale]
    for url, data, now in zip(urls, stale.values(), fs.read_many(urls)):
        if now == data:
            fs.remove(url)


def _bytes_of(marker: dict, path: str) -> int:
    return next(f["bytes"] for s in marker["shards"] for f in layout.shard_files(s) if f["path"] == path)


__all__ = ["ALGORITHM", "CompletedTasks", "RunStart", "check_or_start_run", "completed_tasks", "done_task_ids", "forget_rejected", "load_run",
           "run_record", "save_plan", "start_run", "task_timing", "write_marker"]
