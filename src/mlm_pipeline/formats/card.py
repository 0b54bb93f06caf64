"""The dataset card of a run: ``README.md`` with the YAML header the Hugging Face Hub reads.

Every output gets one (:func:`mlm_pipeline.formats.run_files`), built from its manifest alone, so
every finisher of a run writes the same bytes. Its ``configs`` name the shards as the only data
files, so ``datasets.load_dataset(OUTPUT)`` (and the Hub, after ``hf upload``) reads them and
never the run's own JSON files (``manifest.json``, the task markers), which it would otherwise
take for data. The text says what the data is: objective, tokenizer, settings, counts, inputs.

The card has no ``dataset_info.features``: the shards carry their types (Parquet's schema, the
``hf`` format's Arrow schema with its ``datasets`` features), and the id type follows the
vocabulary size, which the manifest does not record.
"""

from __future__ import annotations

import json
import posixpath

from mlm_pipeline.run import layout

CARD_FILE = "README.md"

DATASETS_READS = (".parquet", ".arrow")
"""Shard extensions ``datasets.load_dataset`` has a builder for (by extension: Parquet, Arrow)."""

_SIZES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
          (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"), (1_000_000_000, "100M<n<1B"),
          (10_000_000_000, "1B<n<10B"), (100_000_000_000, "10B<n<100B"), (1_000_000_000_000, "100B<n<1T"))
"""The Hub's ``size_categories``, by the number of rows."""


def size_category(rows: int) -> str:
    return next((name for limit, name in _SIZES if rows < limit), "n>1T")


def data_files(manifest: dict, extension: str) -> str:
    """The glob of the run's shards, relative to the output (``shards/part-*.parquet``)."""
    if any(s["path"].startswith(layout.out_file_path("")) for s in manifest["shards"]):
        return layout.out_files_glob()
    return layout.shard_glob(extension)


def _q(value) -> str:
    """A YAML scalar (JSON's spelling of a string is YAML's double-quoted one)."""
    return json.dumps(value, ensure_ascii=False)


def _name(path: str) -> str:
    """A file's name without where it lies on the machine that ran ``prepare`` (a Hub name as given)."""
    text = str(path)
    if "://" in text or text.startswith(("/", ".", "~")) or posixpath.splitext(text)[1]:
        return posixpath.basename(text.rstrip("/")) or text
    return text


def _objective_help(name: str) -> str:
    try:
        from mlm_pipeline.instances import get_objective

        return get_objective(name).help
    except ValueError:
        return ""


def _loading(fmt: str, extension: str) -> list[str]:
    if fmt == "hf":
        return ["This directory is a `datasets` dataset as `save_to_disk` writes one:", "", "```python",
                "from datasets import load_from_disk", "", 'ds = load_from_disk("PATH")', "```", "",
                "Uploaded to the Hub (`hf upload REPO PATH --repo-type dataset`), it loads by name:", "",
                "```python", "from datasets import load_dataset", "",
                'ds = load_dataset("REPO", split="train")', "```", "",
                "(`load_dataset(PATH)` on the local directory refuses it, as `datasets` refuses every "
                "`save_to_disk` directory, and names `load_from_disk`.)"]
    if extension in DATASETS_READS:
        return ["```python", "from datasets import load_dataset", "",
                'ds = load_dataset("PATH", split="train")  # or the Hub repository it is uploaded to', "```"]
    return [f"`datasets` has no reader for {fmt} shards (`{extension}`): `load_dataset` finds no supported "
            "data files here. Read them with their trainer's own reader, or prepare the text again with "
            "`--format parquet` or `--format hf`."]


def _source_columns(manifest: dict) -> list[tuple[str, str]]:
    """The columns naming each row's input records, when the run was asked for them."""
    config = manifest.get("config", {})
    rows = []
    if config.get("id_field"):
        rows.append(("document_ids", f"the `{config['id_field']}` of each input record the row's tokens come from, "
                                     "in the order they come (list of strings)"))
    if config.get("metadata_field"):
        rows.append(("document_metadata", f"their `{config['metadata_field']}`, as JSON text (list of strings)"))
    return rows


def _columns(manifest: dict, fmt: str) -> list[str]:
    sources = _source_columns(manifest)
    if fmt == "hf":
        rows = [("input_ids", "token ids (uint16, or uint32 for a vocabulary over 65,536)"),
                ("token_type_ids", "segment ids (int8)")]
        if manifest.get("masking") == "static":
            rows.append(("labels", "the original id at each masked position, -100 elsewhere (int32)"))
        if manifest.get("objective") == "nsp":
            rows.append(("next_sentence_label", "1: segment B is a random segment, 0: the actual next (int8)"))
        if manifest.get("objective") == "sop":
            rows.append(("next_sentence_label", "1: segments A and B swapped (ALBERT's sentence_order_label, int8)"))
            rows.append(("token_boundary", "ALBERT's feature: 1 where a word starts (int8)"))
        rows.append(("document_starts", "packed rows with document boundaries only: where each document begins"))
        rows.append(("language", "language-sampled mixes only: the row's language"))
        rows += sources
        return ["| column | holds |", "|---|---|", *(f"| `{name}` | {what} |" for name, what in rows)]
    return ["The columns are the features of google-research/bert's `run_pretraining.py` (`input_ids`, "
            "`input_mask`, `segment_ids`, `masked_lm_positions`, `masked_lm_ids`, `masked_lm_weights`, "
            "`next_sentence_labels`), as mlm-pipeline's documentation of output formats describes."
            + (" Besides them:" if sources else ""),
            *(["", *(f"- `{name}`: {what}" for name, what in sources)] if sources else [])]


_SETTINGS = ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob", "dupe_factor", "short_seq_prob",
             "do_lower_case", "do_whole_word_mask", "random_seed")
_COUNTS = ("documents_read", "sentences", "tokens", "instances", "masked_tokens", "shards", "bytes_written")


def dataset_card(manifest: dict, extension: str) -> bytes:
    """``README.md`` for the run of ``manifest`` whose shards have ``extension`` (with its dot)."""
    fmt = manifest.get("format", "")
    objective = manifest.get("objective", "")
    config = manifest.get("config", {})
    totals = manifest.get("totals", {})
    instances = sum(int(s["instances"]) for s in manifest["shards"])
    scheme = (manifest.get("masking_scheme") or {}).get("name")
    lines = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        f"    path: {_q(data_files(manifest, extension))}",
        "task_categories:",
        "- fill-mask",
        "tags:",
        "- mlm-pipeline",
        "- pretokenized",
        f"- {_q(objective)}",
        "size_categories:",
        f"- {_q(size_category(instances))}",
        "---",
        "",
        f"# Masked-LM pretraining data: {objective}, {fmt}",
        "",
        f"{instances:,} training instances written by mlm-pipeline {manifest.get('version', '')} in "
        f"{len(manifest['shards']):,} {fmt} shards. Each holds token ids, not text: the tokenizer below "
        "turns them back into text.",
        "",
        "## Loading",
        "",
        *_loading(fmt, extension),
        "",
        "## What an instance is",
        "",
        f"- objective: `{objective}`" + (f" ({_objective_help(objective)})" if _objective_help(objective) else ""),
        f"- masking: `{manifest.get('masking')}`" + (f", scheme `{scheme}`" if scheme else "")
        + ("" if manifest.get("masking") == "static" else " (no masks stored: the training loader masks)"),
        f"- reference mode: `{bool(manifest.get('reference_mode'))}`",
        f"- tokenizer: `{_name(config.get('tokenizer', ''))}`"
        + (f" (SentencePiece model `{_name(config['spm_model_file'])}`)" if config.get("spm_model_file") else "")
        + f", SHA-256 of its files `{manifest.get('tokenizer_fingerprint')}`",
        "",
        *_columns(manifest, fmt),
        "",
        "## Settings",
        "",
        "| setting | value |",
        "|---|---|",
        *(f"| `{key}` | `{config[key]}` |" for key in _SETTINGS if key in config),
        "",
        "Every setting is in `manifest.json` (`config`), with every shard's size and SHA-256 "
        "(`mlm-pipeline verify PATH` checks them).",
        "",
        "## Counts",
        "",
        "| | |",
        "|---|---|",
        *(f"| {key.replace('_', ' ')} | {totals[key]:,} |" for key in _COUNTS if isinstance(totals.get(key), int)),
        "",
        "## Source",
        "",
        f"{len(manifest.get('inputs', [])):,} input files, {sum(int(i.get('bytes') or 0) for i in manifest.get('inputs', [])):,} bytes:",
        "",
        *(f"- `{_name(i['path'])}`" for i in manifest.get("inputs", [])[:20]),
        *([f"- … and {len(manifest['inputs']) - 20:,} more (all of them in `manifest.json`)"]
          if len(manifest.get("inputs", [])) > 20 else []),
        "",
        "The instances are derived from these texts: their licenses and terms apply to this data.",
        "",
    ]
    return "\n".join(lines).encode()


__all__ = ["CARD_FILE", "DATASETS_READS", "data_files", "dataset_card", "size_category"]
