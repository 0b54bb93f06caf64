"""The ``megatron`` output format: Megatron-LM's indexed dataset, a ``.bin``/``.idx`` pair per shard.

Megatron-LM (and NeMo, which reads the same files) builds its BERT instances and masks them
itself, from tokenized documents. So this format writes tokens, not our instances: the rows of
``--objective sentences`` or ``--objective documents`` (:mod:`mlm_pipeline.instances.documents`),
one row per document, unmasked, no ``[CLS]``/``[SEP]``. The bytes are those of
``megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder``:

- ``part-TASK-NNNNN.bin``: every sequence's token ids back to back, in the dtype Megatron's
  ``DType.optimal_dtype(vocab_size)`` picks (``uint16`` below 65,500 ids, else ``int32``);
- ``part-TASK-NNNNN.idx``: ``MMIDIDX\\x00\\x00``, version 1 (``<Q``), the dtype code (``<B``), the
  sequence count and the document count (``<Q`` each; documents + 1), the sequence lengths
  (``int32``), their byte offsets in the ``.bin`` (``int64``) and the document index (``int64``:
  0, then the sequence each document ends before).

A sequence is a sentence (sentence-level: ``preprocess_data.py --split-sentences``, what Megatron
BERT reads) or a whole document (document-level), as the row's ``document_starts`` say: with
``--objective sentences`` each row records where its sentences start. The ``.bin`` streams into the
shard file; the ``.idx`` (20 bytes a sequence, bounded by ``--max-instances-per-shard`` documents)
is the writer's companion file, committed before the ``.bin`` (:class:`~mlm_pipeline.formats.sink.ShardSink`).
``megatron_data_args.txt`` beside the manifest lists every shard's prefix with its weight, as
Megatron's ``--data-path`` (or ``--data-args-path``) takes a blend.

The reader gives the rows back: one per document, its sequences marked by ``document_starts``.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

import numpy as np

from mlm_pipeline import fs
from mlm_pipeline.formats.base import OutputFormat, ShardLayout
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets

HEADER = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES = {np.dtype(np.uint8): 1, np.dtype(np.int8): 2, np.dtype(np.int16): 3, np.dtype(np.int32): 4,
               np.dtype(np.int64): 5, np.dtype(np.float64): 6, np.dtype(np.float32): 7, np.dtype(np.uint16): 8}
"""megatron.core.datasets.indexed_dataset.DType: the code of each token dtype in the ``.idx``."""
_PREAMBLE = struct.Struct("<9sQBQQ")  # header, version, dtype code, sequences, documents + 1
DATA_ARGS_FILE = "megatron_data_args.txt"
LONG_SENTENCE = 512
"""megatron-core's ``LONG_SENTENCE_LEN`` (datasets/helpers.cpp): a document of two or more
sentences holding a longer one is left out of its BERT (and T5) samples."""


def token_dtype(vocab_size: int | None) -> np.dtype:
    """Megatron's ``DType.optimal_dtype(vocab_size)``: ``uint16`` for fewer than 65,500 ids, else
    ``int32`` (also when the size is unknown), as ``preprocess_data.py`` writes."""
    return np.dtype(np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32)


def sequence_layout(batch: InstanceBatch) -> tuple[np.ndarray, np.ndarray]:
    """(each sequence's length, each row's sequence count) of a batch of document rows: a row's
    ``document_starts`` cut it into sequences (sentences); without them a row is one sequence."""
    if batch.document_starts is None:
        return batch.lengths.astype(np.int64), np.ones(len(batch), np.int64)
    counts = np.diff(batch.document_offsets)
    starts = batch.document_starts.astype(np.int64) + np.repeat(batch.offsets[:-1], counts)
    return np.diff(np.append(starts, batch.offsets[-1])), counts.astype(np.int64)


def bert_skips(sequence_lengths: np.ndarray, doc_sequences: np.ndarray) -> dict[str, int]:
    """What megatron-core's BERT sample index (``helpers.build_mapping``) leaves out of these
    documents: ``megatron_one_sentence_documents``, documents of one sequence (left out with the
    binary head, Megatron BERT's default, which needs 2 sentences; kept with
    ``--bert-no-binary-head``), and ``megatron_long_sentence_documents``, documents of two or more
    sequences, one over 512 tokens (always left out)."""
    if not len(doc_sequences):
        return {"megatron_one_sentence_documents": 0, "megatron_long_sentence_documents": 0}
    doc_offsets = lengths_to_offsets(doc_sequences)
    longest = np.maximum.reduceat(sequence_lengths, doc_offsets[:-1])
    return {"megatron_one_sentence_documents": int(np.count_nonzero(doc_sequences == 1)),
            "megatron_long_sentence_documents": int(np.count_nonzero((doc_sequences > 1) & (longest > LONG_SENTENCE)))}


def index_bytes(sequence_lengths: np.ndarray, doc_sequences: np.ndarray, dtype: np.dtype) -> bytes:
    """The ``.idx`` of these sequences and documents, byte for byte as ``_IndexWriter`` writes it."""
    lengths = np.asarray(sequence_lengths, np.int32)
    pointers = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    documents = lengths_to_offsets(doc_sequences)
    return b"".join([_PREAMBLE.pack(HEADER, VERSION, DTYPE_CODES[dtype], len(lengths), len(documents)),
                     lengths.tobytes(), pointers.tobytes(), documents.astype(np.int64).tobytes()])


class MegatronShardWriter:
    """Streams the token ids of document rows into the ``.bin`` (an open binary file; not closed
    here) and keeps each sequence's length for the ``.idx``, which :meth:`close` returns."""

    def __init__(self, f: BinaryIO, *, vocab_size: int | None = None, **_settings):
        self._f = f
        self._dtype = token_dtype(vocab_size)
        self._lengths: list[np.ndarray] = []
        self._doc_sequences: list[np.ndarray] = []

    def write(self, batch: InstanceBatch) -> None:
        if not len(batch):
            return
        ids = batch.input_ids
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) > np.iinfo(self._dtype).max):
            raise ValueError(f"token ids from {int(ids.min())} to {int(ids.max())} do not fit Megatron's {self._dtype} "
                             "(chosen from the tokenizer's vocabulary size)")
        lengths, doc_sequences = sequence_layout(batch)
        self._f.write(memoryview(ids.astype(self._dtype, copy=False)).cast("B"))
        self._lengths.append(lengths)
        self._doc_sequences.append(doc_sequences)

    def close(self) -> dict[str, bytes]:
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        docs = np.concatenate(self._doc_sequences) if self._doc_sequences else np.zeros(0, np.int64)
        return {".idx": index_bytes(lengths, docs, self._dtype)}


def idx_url(bin_url: str) -> str:
    """The ``.idx`` beside a ``.bin`` (both named by the Megatron prefix)."""
    if not bin_url.endswith(".bin"):
        raise ValueError(f"{bin_url}: a Megatron shard's data file ends with .bin")
    return bin_url[: -len(".bin")] + ".idx"


def read_index(data: bytes) -> tuple[np.dtype, np.ndarray, np.ndarray, np.ndarray]:
    """(token dtype, sequence lengths, sequence pointers, document index) of an ``.idx``;
    ``ValueError`` saying what is wrong with a damaged one."""
    if len(data) < _PREAMBLE.size:
        raise ValueError(f"an .idx of {len(data)} bytes is shorter than its {_PREAMBLE.size}-byte header")
    header, version, code, sequences, documents = _PREAMBLE.unpack_from(data)
    if header != HEADER or version != VERSION:
        raise ValueError(f"not a Megatron index (header {header!r}, version {version})")
    dtype = next((d for d, c in DTYPE_CODES.items() if c == code), None)
    if dtype is None:
        raise ValueError(f"unknown dtype code {code} in the .idx")
    expected = _PREAMBLE.size + 12 * sequences + 8 * documents
    if len(data) != expected:
        raise ValueError(f"the .idx has {len(data)} bytes; {sequences} sequences and {documents} document "
                         f"boundaries take {expected}")
    at = _PREAMBLE.size
    lengths = np.frombuffer(data, np.int32, sequences, at)
    pointers = np.frombuffer(data, np.int64, sequences, at + 4 * sequences)
    doc_index = np.frombuffer(data, np.int64, documents, at + 12 * sequences)
    return dtype, lengths, pointers, doc_index


def read_megatron(url: str) -> InstanceBatch:
    """A whole shard (the ``.bin``'s URL; its ``.idx`` beside it): one row per document, its
    sequences' starts in ``document_starts``. ``ValueError`` if the pair does not agree."""
    dtype, lengths, pointers, doc_index = read_index(fs.read_bytes(idx_url(url)))
    data = fs.read_bytes(url)
    ends = lengths_to_offsets(lengths) * dtype.itemsize
    if (len(doc_index) == 0 or doc_index[0] != 0 or doc_index[-1] != len(lengths)
            or np.any(np.diff(doc_index) <= 0) or (len(lengths) and lengths.min() < 0)):
        raise ValueError("the .idx's document index or sequence lengths are inconsistent")
    if not np.array_equal(pointers, ends[:-1]) or len(data) != ends[-1]:
        raise ValueError(f"the .bin has {len(data)} bytes; its .idx points to {int(ends[-1])}")
    ids = np.frombuffer(data, dtype).astype(np.int32)
    token_offsets = lengths_to_offsets(lengths)
    row_offsets = token_offsets[doc_index]
    doc_of_sequence = np.repeat(np.arange(len(doc_index) - 1), np.diff(doc_index))
    batch = InstanceBatch.unmasked(ids, np.zeros(len(ids), np.int8), row_offsets)
    batch.document_starts = (token_offsets[:-1] - row_offsets[doc_of_sequence]).astype(np.int32)
    batch.document_offsets = doc_index.astype(np.int64)
    return batch


def read_layout(url: str, lengths: bool = False) -> ShardLayout:
    """One row group (the shard) and, if asked, each document's tokens, from the ``.idx`` alone."""
    _, sequence_lengths, _, doc_index = read_index(fs.read_bytes(idx_url(url)))
    rows = np.array([len(doc_index) - 1], np.int64)
    if not lengths:
        return ShardLayout(rows)
    return ShardLayout(rows, np.diff(lengths_to_offsets(sequence_lengths)[doc_index]).astype(np.int32))


def prefix(path: str) -> str:
    """A shard's Megatron prefix: its path without ``.bin``."""
    return path[: -len(".bin")] if path.endswith(".bin") else path


def data_args(manifest: dict) -> dict[str, bytes]:
    """``megatron_data_args.txt``: ``WEIGHT PREFIX`` a line, every shard in the manifest's order,
    the prefixes relative to the output directory and each weight the shard's ``.bin`` size in
    bytes, which is its token count times the token size every shard of a run shares: Megatron
    normalizes the weights, so shards are drawn in proportion to their tokens. The whitespace-separated list is what
    ``--data-path`` takes, and ``--data-args-path`` reads from a file."""
    lines = [f"{shard['bytes']} {prefix(shard['path'])}\n" for shard in manifest["shards"]]
    return {DATA_ARGS_FILE: "".join(lines).encode()}


FORMAT = OutputFormat(name="megatron", open_writer=MegatronShardWriter, read_shard=read_megatron,
                      read_layout=read_layout, run_files=data_args, suffix="bin", companions=(".idx",))
