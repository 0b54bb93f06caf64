"""Decode shards back to text: ``[CLS] the [MASK] sat ... [SEP]`` plus the masked labels.

Shards are read by the reader of the format their run recorded; only a shard file on its own
(no run around it) is recognised by its extension.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Iterator

from mlm_pipeline import fs
from mlm_pipeline.errors import InspectError, TokenizerError
from mlm_pipeline.formats import OutputFormat, get_output_format, output_format_for_file, output_format_names
from mlm_pipeline.instances import get_objective, objective_names
from mlm_pipeline.instances.batch import InstanceBatch
from mlm_pipeline.run import layout
from mlm_pipeline.run.manifest import read_manifest


def read_shard(url: str, fmt: str | None = None) -> InstanceBatch:
    """A whole shard, read by its format's reader.

    ``fmt`` is the format its run recorded; without it (a shard file on its own) the format is
    told by the file's extension.
    """
    return (get_output_format(fmt) if fmt else _format_of_file(url)).read(url)


def _known() -> str:
    return ", ".join(get_output_format(name).extension for name in output_format_names())


def _format_of_file(url: str) -> OutputFormat:
    found = output_format_for_file(url)
    if found is None:
        raise InspectError(f"{url}: not a shard of a known output format ({_known()}) and not inside a prepared "
                           f"output; expected a shard file written by mlm-pipeline prepare, or its output directory")
    return found


def _read(output_format: OutputFormat, url: str) -> InstanceBatch:
    """A shard read by ``output_format``, a file that is not one named in the error."""
    try:
        return output_format.read_shard(url)
    except FileNotFoundError:
        raise InspectError(f"{url}: no such shard (was the output moved or cleaned?)") from None
    except (ValueError, OSError, KeyError, IndexError) as exc:  # each reader's own complaint
        raise InspectError(f"{url}: not a readable {output_format.name} shard ({exc})") from None


def _named_format(name, where: str) -> OutputFormat:
    if not name:
        raise InspectError(f"{where} records no output format")
    try:
        return get_output_format(name)
    except ValueError as exc:
        raise InspectError(f"{where}: {exc}") from None


def _run_of(output: str) -> tuple[dict, OutputFormat, list[str], str | None] | None:
    """The settings, format, shard URLs and tokenizer fingerprint of the run in ``output``;
    ``None`` if there is none.

    A finished run is read from its manifest (its shards, its ``format``); a run still going from
    its run record, its shards being those committed so far.
    """
    manifest_url = layout.manifest_url(output)
    layout.refuse_links(output)
    if fs.exists(manifest_url):
        manifest = read_manifest(output)
        output_format = _named_format(manifest.get("format"), manifest_url)
        paths = [s["path"] for s in manifest.get("shards", [])]
        shards = [layout.shard_url(output, p) for p in paths]
        return manifest.get("config", {}), output_format, shards, manifest.get("tokenizer_fingerprint")
    run_url = layout.run_url(output)
    if fs.exists(run_url):
        record = json.loads(fs.read_bytes(run_url))
        settings = record.get("settings", {})
        output_format = _named_format(settings.get("format"), run_url)
        listed = [p for d in layout.shard_dir_urls(output) if fs.exists(d) for p in fs.listdir(d)]
        return settings, output_format, sorted(
            p for p in listed if p.endswith(output_format.extension) or f"/{layout.OUT_FILE_PREFIX}-" in p
        ), record.get("tokenizer_fingerprint")
    return None


def _resolve(path: str) -> tuple[list[str], dict, OutputFormat, str | None]:
    """Shard URLs to show, the run's settings (if the path is, or is inside, an output), the format
    and the fingerprint of the run's tokenizer (if known)."""
    run = _run_of(path)
    if run is not None:
        settings, output_format, shards, tok_fp = run
        if not shards:
            raise InspectError(f"{path} has no shards yet")
        return shards, settings, output_format, tok_fp
    if not fs.exists(path):
        raise InspectError(f"no such file or directory: {path}")
    if fs.isdir(path):
        raise InspectError(f"{path}: a directory without manifest.json or _run.json, so not an output of "
                           f"mlm-pipeline prepare; expected a prepared output directory or a shard file ({_known()})")
    here = os.path.dirname(path.rstrip("/"))
    if _run_of(here or ".") is not None:  # OUTPUT/manifest.json, OUTPUT/_run.json, ...
        raise InspectError(f"{path}: a file of the prepared output {here or '.'}, not a shard; "
                           f"run: mlm-pipeline inspect {shlex.quote(here or '.')}")
    parent = os.path.dirname(here)  # OUTPUT of OUTPUT/shards/FILE
    run = _run_of(parent or ".")
    if run is not None:
        return [path], run[0], run[1], run[3]
    return [path], {}, _format_of_file(path), None


def format_instance(batch: InstanceBatch, i: int, tok, *, nsp: bool = True,
                    label_names: tuple[str, str] = ("actual next", "random next")) -> str:
    """One instance as text; ``nsp``: its objective has next-sentence labels (TFRecord's layout
    stores the feature for every objective, 0 where there is none), ``label_names`` what they mean."""
    row = batch.row(i)
    tokens = tok.convert_ids_to_tokens(row["input_ids"])
    n_a = row["segment_ids"].count(0)
    labels = " ".join(
        f"{p}:{t}" for p, t in zip(row["masked_lm_positions"], tok.convert_ids_to_tokens(row["masked_lm_ids"]))
    )
    head = f"#{i}  length {len(tokens)}  segment A {n_a}"
    if len(row.get("document_starts", ())) > 1:  # a packed row of several documents
        head += f"  documents at {', '.join(map(str, row['document_starts']))}"
    if nsp and "next_sentence_label" in row:
        head += f"  next_sentence_label {row['next_sentence_label']} ({label_names[row['next_sentence_label']]})"
    text = f"{head}\n  {' '.join(tokens)}\n  masked: {labels or '(none)'}"
    if "document_ids" in row:  # (--id-field: the input records its tokens come from)
        text += f"\n  from: {', '.join(row['document_ids'])}"
    return text


SHARD_HEADER = "== "  # starts the line naming each shard shown (the CLI sends it to stderr with --json)


def inspect_lines(path: str, *, n: int, tokenizer: str | None, do_lower_case: bool | None, as_json: bool) -> Iterator[str]:
    shards, settings, output_format, tok_fp = _resolve(path)
    first = _read(output_format, shards[0])  # a file that is no shard is named before any tokenizer is asked for
    tok = None
    if not as_json:
        from mlm_pipeline.tokenize import load_tokenizer

        tok_path = tokenizer or settings.get("tokenizer")
        if not tok_path:
            raise InspectError("cannot tell which tokenizer made this shard: pass --tokenizer")
        lower = settings.get("do_lower_case", True) if do_lower_case is None else do_lower_case
        try:
            tok = load_tokenizer(tok_path, lower, settings.get("tokenizer_flavor", "bert"))
        except TokenizerError as exc:
            if tokenizer:
                raise
            # an output copied to another machine, or a vocab moved since: the recorded path is gone
            raise InspectError(f"the tokenizer this output was made with, as its {layout.RUN_FILE} records it, "
                               f"cannot be loaded ({exc}): pass a copy of it with --tokenizer/-t, or use --json "
                               "for the ids") from None
        if tok_fp and tok.fingerprint != tok_fp:  # its tokens would be other words, [MASK] included
            raise InspectError(f"tokenizer {tok_path} (do_lower_case={bool(lower)}) is not the one that prepared "
                               f"{path}: its fingerprint differs from the run's; pass that one, or use --json for the ids")
    objective = settings.get("objective")
    nsp = objective not in objective_names() or get_objective(objective).has_nsp_labels
    label_names = get_objective(objective).label_names if objective in objective_names() else None
    shown = 0
    for k, url in enumerate(shards):
        batch = first if k == 0 else _read(output_format, url)
        yield f"{SHARD_HEADER}{url}: {len(batch):,} instances"
        for i in range(min(len(batch), n - shown)):
            if as_json:
                yield json.dumps(batch.row(i))
            else:
                yield format_instance(batch, i, tok, nsp=nsp, **({"label_names": label_names} if label_names else {}))
            shown += 1
        if shown >= n:
            return
