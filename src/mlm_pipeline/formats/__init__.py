"""Output formats: one module per format, each with its writer and its reader, found by name.

The name is what a run records in its manifest's ``format`` field (and the shard files'
extension), so ``inspect``, ``report`` and the torch loader pick the reader from the manifest,
never from a file name. Only a shard file given on its own, without its run, is recognised by its
extension (:func:`output_format_for_file`).

Built-in formats are imported on first use (Parquet pulls in pyarrow, ~0.4 s per process):

- ``tfrecord`` (:mod:`mlm_pipeline.formats.tfrecord`): ``tf.train.Example`` records with the
  features of google-research/bert's ``run_pretraining.py``, padded.
- ``parquet`` (:mod:`mlm_pipeline.formats.parquet`): the same columns unpadded, zstd-compressed.
- ``mds`` (:mod:`mlm_pipeline.formats.mds`): mosaicml-streaming's MDS shards and ``index.json``.
- ``megatron`` (:mod:`mlm_pipeline.formats.megatron`): Megatron-LM's ``.bin``/``.idx`` of tokenized
  documents (its shard files end in ``.bin``, with the ``.idx`` beside them).
- ``hf`` (:mod:`mlm_pipeline.formats.hf`): a Hugging Face ``datasets`` dataset (``.arrow``
  shards and the ``state.json`` of ``save_to_disk``), with the columns its models take.

A new format is one module defining an :class:`OutputFormat`, plus one line in ``_BUILT_IN``; or,
from the outside, one :func:`register_output_format` call. A registration lives in the process
that makes it: spawned worker processes (Ray's, and the local pool's when the driver runs other
threads) know the formats of ``_BUILT_IN`` and those that modules they import register.
"""

from __future__ import annotations

import importlib
import re

from mlm_pipeline.errors import ConfigError
from mlm_pipeline.formats.base import OutputFormat, ShardLayout, ShardRows, ShardWriter, WholeShardRows

__all__ = [
    "OutputFormat",
    "ShardLayout",
    "ShardRows",
    "ShardWriter",
    "WholeShardRows",
    "get_output_format",
    "output_format_for_file",
    "output_format_names",
    "register_output_format",
    "run_files",
    "unregister_output_format",
]

# name -> module whose ``FORMAT`` is the format (imported on first use)
_BUILT_IN: dict[str, str] = {
    "tfrecord": "mlm_pipeline.formats.tfrecord",
    "parquet": "mlm_pipeline.formats.parquet",
    "mds": "mlm_pipeline.formats.mds",
    "megatron": "mlm_pipeline.formats.megatron",
    "hf": "mlm_pipeline.formats.hf",
}
_REGISTERED: dict[str, OutputFormat] = {}


def register_output_format(output_format: OutputFormat, *, replace: bool = False) -> OutputFormat:
    """Make ``output_format`` available under its name (to ``prepare``, ``inspect``, the loader).

    ``ValueError`` if the name is taken (a built-in format or an earlier registration), unless
    ``replace``. Returns the format, so a module can write ``FORMAT = register_output_format(...)``.
    """
    if not isinstance(output_format, OutputFormat):
        raise ValueError(f"register_output_format needs an OutputFormat, got {type(output_format).__name__}")
    name = output_format.name
    if not replace and (name in _REGISTERED or name in _BUILT_IN):
        raise ValueError(f"output format {name!r} is already registered (pass replace=True to replace it)")
    _REGISTERED[name] = output_format
    return output_format


def unregister_output_format(name: str) -> None:
    """Forget a format registered with :func:`register_output_format` (a replaced built-in format
    comes back). ``ValueError`` if no format was registered under ``name``."""
    if name not in _REGISTERED and name not in _BUILT_IN:
        raise ValueError(f"no output format {name!r} is registered")
    _REGISTERED.pop(name, None)


def output_format_names() -> tuple[str, ...]:
    """Every known format name: the built-in ones first, then registered ones (imports nothing)."""
    return tuple(_BUILT_IN) + tuple(n for n in _REGISTERED if n not in _BUILT_IN)


def get_output_format(name: str) -> OutputFormat:
    """The format recorded as ``name`` (a manifest's ``format``, the ``format`` setting).

    ``ConfigError`` (a ``ValueError``) naming the known formats if there is none by that name.
    """
    found = _REGISTERED.get(name)
    if found is not None:
        return found
    if isinstance(name, str) and name in _BUILT_IN:
        found = _REGISTERED[name] = importlib.import_module(_BUILT_IN[name]).FORMAT
        return found
    raise ConfigError(f"unknown output format {name!r}; known formats: {', '.join(output_format_names())}")


def output_format_for_file(path: str) -> OutputFormat | None:
    """The format of a shard file given on its own (no manifest at hand), told by its extension
    (ELECTRA's numbered files too: ``pretrain_data.tfrecord-3-of-1000``).

    ``None`` if no known format uses that extension. Prefer the run's recorded format wherever
    there is one.
    """
    for name in output_format_names():
        found = get_output_format(name)
        if re.search(rf"{re.escape(found.extension)}(-\d+-of-\d+)?$", path):
            return found
    return None


def run_files(manifest: dict) -> dict[str, bytes]:
    """The files a finished run holds beside its shards and ``manifest.json`` (relative path ->
    bytes), from its manifest alone: its dataset card (:mod:`mlm_pipeline.formats.card`), then
    those of its format (:attr:`OutputFormat.run_files`)."""
    from mlm_pipeline.formats.card import CARD_FILE, dataset_card

    output_format = get_output_format(manifest["format"])
    files = {CARD_FILE: dataset_card(manifest, output_format.extension)}
    if output_format.run_files is not None:
        files.update(output_format.run_files(manifest))
    return files
