"""What the loader needs from a prepared output: its shards, their format and reader, its settings.

:func:`load_prepared` reads ``OUTPUT/manifest.json`` into a :class:`PreparedOutput`. The shards are
read by the reader of the format the manifest records (``format``, looked up in
:mod:`mlm_pipeline.formats`), never chosen by file name: :func:`read_layouts` reads what an epoch
is planned with (each shard's row groups and, for length bins, its rows' lengths) and
:class:`ShardRowReader` reads row ranges, keeping the most recently read shards open. Nothing here
imports torch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from mlm_pipeline import fs
from mlm_pipeline.formats import OutputFormat, ShardLayout, ShardRows, get_output_format
from mlm_pipeline.instances import get_objective, objective_names
from mlm_pipeline.instances.batch import InstanceBatch
from mlm_pipeline.run import layout

__all__ = ["PreparedOutput", "ShardEntry", "ShardRowReader", "load_prepared", "read_layouts", "verify_shard"]

MASKINGS = ("static", "none")


@dataclass(frozen=True)
class ShardEntry:
    url: str
    instances: int
    bytes: int | None = None  # as the manifest records them (None in a hand-made manifest)
    sha256: str | None = None


@dataclass(frozen=True)
class PreparedOutput:
    """What the loader needs from ``OUTPUT/manifest.json``."""

    url: str
    shards: tuple[ShardEntry, ...]
    format: OutputFormat
    objective: str  # a name of the objective registry (mlm_pipeline.instances)
    masking: str  # "static" | "none"
    config: dict
    tokenizer_fingerprint: str | None = None
    languages: dict | None = None  # runs with languages: totals["languages"] (each language's counts)

    @property
    def has_nsp(self) -> bool:
        return get_objective(self.objective).has_nsp_labels

    @property
    def tokenizer_flavor(self) -> str:
        """The text normalization the run used (runs before the setting existed used ``bert``)."""
        return self.config.get("tokenizer_flavor", "bert")

    @property
    def load_masking(self) -> str:
        """The loader's masking for unmasked shards of this objective: ``dynamic`` or ``electra``."""
        return get_objective(self.objective).load_masking

    @property
    def sentence_label(self) -> str:
        """The batch key of its pair label: ``next_sentence_label``, or ``sentence_order_label``
        for ``sop`` (``AlbertForPreTraining``'s argument)."""
        return get_objective(self.objective).sentence_label

    @property
    def masking_scheme(self) -> dict:
        """The masking scheme the run recorded, with its parameters, as :class:`MLMCollator`
        arguments (``masking_scheme``, ``ngram``, ...): how dynamic masking masks this output by
        default. A manifest from before schemes were recorded: the objective's default scheme."""
        from mlm_pipeline.config import MASKING_PARAMETERS

        scheme = self.config.get("masking_scheme") or get_objective(self.objective).default_masking_scheme
        return {"masking_scheme": scheme, **{k: self.config[k] for k in MASKING_PARAMETERS if k in self.config}}

    @property
    def masked_lm_prob(self) -> float:
        """The masking rate the run recorded (``--masked-lm-prob``): dynamic masking's by default,
        so that each phase of a schedule masks at its own rate."""
        return float(self.config.get("masked_lm_prob", 0.15))

    def word_continuation(self, tokenizer) -> np.ndarray | None:
        """Per id, whether a token continues a word as the objective groups words (``sop``:
        ALBERT's, the complement of ``token_boundary``); None: the tokenizer's own marker."""
        rule = get_objective(self.objective).word_continuation
        return None if rule is None else np.asarray(rule(tokenizer), dtype=bool)

    @property
    def is_masked(self) -> bool:
        return self.masking == "static"

    @property
    def auto_masking(self) -> str:
        """What ``masking="auto"`` means for this output: its static masks, else the load-time masking."""
        return "static" if self.is_masked else self.load_masking

    @property
    def total(self) -> int:
        return sum(s.instances for s in self.shards)

    @property
    def shard_counts(self) -> np.ndarray:
        """Instances per shard, in manifest order (int64)."""
        return np.array([s.instances for s in self.shards], dtype=np.int64)

    @property
    def max_seq_length(self) -> int | None:
        return self.config.get("max_seq_length")

    def fingerprint(self, *, contents: bool = True) -> str:
        """sha256 of the shard list (paths, counts and each shard's SHA-256 where the manifest has
        it): a state only applies to the same shards, not to an output prepared again with other
        settings into files of the same names and sizes. ``contents=False``: paths and counts only,
        as states saved by earlier versions of the loader carry it
        (:meth:`~mlm_pipeline.torch.MLMDataset.load_state_dict` accepts it)."""
        blob = json.dumps([[s.url.rsplit("/", 2)[-2:], s.instances, *([s.sha256] if contents and s.sha256 else [])]
                           for s in self.shards]).encode()
        return hashlib.sha256(blob).hexdigest()

    def tokenizer(self, path: str | None = None, do_lower_case: bool | None = None):
        """The tokenizer recorded in the manifest (or ``path``), loaded with ``load_tokenizer``.

        ``ValueError`` if it is not the tokenizer that prepared the shards (the manifest's
        fingerprint of its vocabulary and settings differs).
        """
        from mlm_pipeline.tokenize import load_tokenizer

        recorded = self.config.get("tokenizer")
        if not (path or recorded):
            raise ValueError(f"{self.url}: the manifest names no tokenizer; pass one explicitly")
        if not path and not os.path.exists(recorded):
            raise ValueError(
                f"the tokenizer recorded in {self.url}/manifest.json, {recorded!r}, is not found from "
                f"{os.getcwd()} (a relative path is relative to where prepare ran): pass the tokenizer explicitly"
            )
        lower = self.config.get("do_lower_case", True) if do_lower_case is None else do_lower_case
        tok = load_tokenizer(str(path or recorded), bool(lower), self.tokenizer_flavor)
        if self.tokenizer_fingerprint and tok.fingerprint != self.tokenizer_fingerprint:
            raise ValueError(
                f"tokenizer {path or recorded} (do_lower_case={bool(lower)}) is not the one that prepared "
                f"{self.url}: its fingerprint differs from the manifest's"
            )
        return tok


def load_prepared(url: str) -> PreparedOutput:
    """Read ``url/manifest.json`` (local path or fsspec URL such as ``s3://bucket/out``)."""
    manifest_url = layout.manifest_url(url)
    layout.refuse_a_file(url)
    try:
        manifest = json.loads(fs.read_bytes(manifest_url))
    except FileNotFoundError:
        if not fs.exists(url):  # (said first: "no manifest.json in" a directory that is not there misled)
            raise ValueError(f"{url}: no such directory (expected the output directory of a prepare run)") from None
        raise ValueError(f"no manifest.json in {url}: not a prepared output, or its run is not complete") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"cannot parse {manifest_url}: {exc}") from exc
    if "format" not in manifest:
        raise ValueError(f"{manifest_url} records no output format")
    try:
        output_format = get_output_format(manifest["format"])
    except ValueError as exc:
        raise ValueError(f"{manifest_url}: {exc}") from None
    shards = []
    for entry in manifest.get("shards", []):
        shards.append(ShardEntry(url=layout.shard_url(url, entry["path"]), instances=int(entry["instances"]), bytes=entry.get("bytes"),
                                 sha256=entry.get("sha256")))
    objective = manifest.get("objective", "nsp")
    masking = manifest.get("masking", "static")
    if objective not in objective_names():
        raise ValueError(f"{manifest_url}: unknown objective {objective!r}")
    if masking not in MASKINGS:
        raise ValueError(f"{manifest_url}: unknown masking {masking!r}")
    return PreparedOutput(url=url, shards=tuple(shards), format=output_format, objective=objective, masking=masking,
                          config=dict(manifest.get("config", {})),
                          tokenizer_fingerprint=manifest.get("tokenizer_fingerprint"),
                          languages=manifest.get("totals", {}).get("languages"))


def read_layouts(outputs: list[PreparedOutput], *, lengths: bool, verify: str = "size",
                 threads: int = 8) -> list[ShardLayout]:
    """The :class:`~mlm_pipeline.formats.base.ShardLayout` of every shard of ``outputs`` (global
    shard order), read in ``threads`` threads (on an object store each is a request or two).

    Parquet: the footer, and for ``lengths`` the ``input_mask`` column (about 1% of a shard).
    A format without layouts: one row group per shard, and for ``lengths`` the whole shard read.
    Unless ``verify`` is ``none``, each shard's size is checked first (a missing or truncated
    shard is named as such); the SHA-256 check, if asked for, is left to the row readers.
    """
    jobs = [(out.format, entry) for out in outputs for entry in out.shards]

    def one(job: tuple[OutputFormat, ShardEntry]) -> ShardLayout:
        fmt, entry = job
        verify_shard(entry, "none" if verify == "none" else "size")
        layout = fmt.layout(entry.url, instances=entry.instances, lengths=lengths)
        if int(layout.row_groups.sum()) != entry.instances:
            raise ValueError(f"{entry.url}: has {int(layout.row_groups.sum())} rows, the manifest says "
                             f"{entry.instances} (was the shard changed?)")
        return layout

    with ThreadPoolExecutor(max(1, min(threads, len(jobs)))) as pool:
        return list(pool.map(one, jobs))


_VERIFIED: set[tuple[str, str]] = set()  # (shard URL, check) verified in this process


def verify_shard(entry: ShardEntry, check: str) -> None:
    """Check a shard against the manifest's size and SHA-256 (``check``: ``sha256``, ``size`` or
    ``none``), once per process; :class:`~mlm_pipeline.errors.ShardDamaged` naming it if it differs."""
    from mlm_pipeline.errors import ShardDamaged
    from mlm_pipeline.verify import check_shard

    if check == "none" or (entry.url, check) in _VERIFIED:
        return
    problem = check_shard(entry.url, size=entry.bytes, sha256=entry.sha256, check=check)
    if problem == "missing":
        raise ShardDamaged(entry.url, FileNotFoundError(entry.url))
    if problem is not None:
        raise ShardDamaged(entry.url, ValueError(f"{problem} in manifest.json"))
    _VERIFIED.add((entry.url, check))


class ShardRowReader:
    """Reads rows ``[start, stop)`` of the shards of one or more prepared outputs.

    Shards are numbered globally: the outputs' shards in manifest order, concatenated. Up to
    ``max_open`` shards stay open (the least recently read is closed first), so a worker that
    reads a little of many shards in turn, as an interleaved epoch does, opens each once. Reading
    goes through the format's row access (:meth:`OutputFormat.rows`): Parquet reads only the row
    groups a range overlaps (and keeps the last one for the next range), TFRecord skips the
    records before it by their headers and reads on from where the previous range ended. With
    ``layouts`` (:func:`read_layouts`), a shard is opened with its footer, which is then not read
    again. Each shard is checked against its manifest when this process first opens it
    (``verify``, see :func:`verify_shard`).
    """

    def __init__(self, prepared: PreparedOutput | list[PreparedOutput], max_open: int = 1, *,
                 verify: str = "sha256", layouts: list[ShardLayout] | None = None):
        from mlm_pipeline.verify import CHECKS

        if verify not in CHECKS:
            raise ValueError(f"verify must be one of {', '.join(CHECKS)}, got {verify!r}")
        self._verify = verify
        outputs = prepared if isinstance(prepared, (list, tuple)) else [prepared]
        self._shards = [(out.format, entry) for out in outputs for entry in out.shards]
        self._layouts = layouts
        self._max_open = max(1, max_open)
        self._open: OrderedDict[int, ShardRows] = OrderedDict()

    def read(self, shard: int, start: int, stop: int) -> InstanceBatch:
        """Rows ``[start, stop)`` of shard number ``shard``."""
        if stop <= start:
            return InstanceBatch.empty()
        fmt, entry = self._shards[shard]
        rows = self._open.pop(shard, None)
        if rows is None:
            while len(self._open) >= self._max_open:
                self._open.popitem(last=False)[1].close()
            verify_shard(entry, self._verify)
            rows = fmt.rows(entry.url, self._layouts[shard].footer if self._layouts else None)
        self._open[shard] = rows
        batch = rows.read(start, stop)
        if len(batch) != stop - start:
            raise ValueError(
                f"{entry.url}: expected rows {start}..{stop} but read {len(batch)} "
                f"(the manifest says {entry.instances} instances; was the shard changed?)"
            )
        return batch

    def close(self) -> None:
        while self._open:
            self._open.popitem(last=False)[1].close()
