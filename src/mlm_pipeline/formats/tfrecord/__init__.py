"""The ``tfrecord`` output format: BERT ``tf.train.Example`` records, written and read without TensorFlow.

Shards hold one ``tf.train.Example`` per instance with exactly the features of google-research/bert
``create_pretraining_data.py`` (``run_pretraining.py`` and ``tf.data.TFRecordDataset`` read them),
padded to ``max_seq_length`` / ``max_predictions_per_seq``. The code is in three modules:

- :mod:`.wire`: record framing and CRC32C, the protobuf tags of ``tf.train.Example``;
- :mod:`.encode`: instances to records (:func:`encode_tfrecord`, :func:`encode_examples`);
- :mod:`.decode`: records to features and instances (:func:`decode_records`,
  :func:`features_to_batch`, :func:`read_tfrecord`, :func:`parse_example`).

This module joins them into the format: :class:`TFRecordShardWriter`, :class:`TFRecordRows` (row
ranges for the loader: records before the range skipped by their headers) and :data:`FORMAT`.
"""

from __future__ import annotations

import io
import itertools
from typing import BinaryIO

from mlm_pipeline import fs
from mlm_pipeline.formats.base import OutputFormat
from mlm_pipeline.formats.tfrecord.decode import (
    decode_examples,
    decode_records,
    features_to_batch,
    parse_example,
    read_tfrecord,
    read_tfrecord_features,
)
from mlm_pipeline.formats.tfrecord.encode import (
    encode_examples,
    encode_tfrecord,
    iter_encoded_examples,
    iter_encoded_sequences,
    iter_encoded_tfrecord,
)
from mlm_pipeline.formats.tfrecord.wire import (
    BERT_FEATURES,
    SEQUENCE_FEATURES,
    iter_tfrecord_records,
    masked_crc32c,
    record_spans,
    skip_records,
)
from mlm_pipeline.instances.batch import InstanceBatch

__all__ = [
    "BERT_FEATURES",
    "FORMAT",
    "SEQUENCE_FEATURES",
    "TFRecordRows",
    "TFRecordShardWriter",
    "decode_examples",
    "decode_records",
    "encode_examples",
    "encode_tfrecord",
    "features_to_batch",
    "iter_encoded_examples",
    "iter_encoded_sequences",
    "iter_encoded_tfrecord",
    "iter_tfrecord_records",
    "masked_crc32c",
    "parse_example",
    "read_tfrecord",
    "read_tfrecord_features",
    "record_spans",
]


class TFRecordShardWriter:
    """Appends blocks of instances to one TFRecord file (an open binary file; not closed here).

    ``max_predictions`` 0 (a run without masked-LM slots: ``--objective electra``) writes
    ELECTRA's records, the three sequence features only; otherwise BERT's seven features.
    """

    def __init__(self, f: BinaryIO, *, max_seq_length: int, max_predictions: int, **_settings):
        self._f = f
        self._seq = max_seq_length
        self._pred = max_predictions

    def write(self, batch: InstanceBatch) -> None:
        if self._pred == 0:
            chunks = iter_encoded_sequences(batch, max_seq_length=self._seq)
        else:
            chunks = iter_encoded_tfrecord(batch, max_seq_length=self._seq, max_predictions=self._pred)
        for chunk in chunks:
            self._f.write(chunk)

    def close(self) -> None:
        """Nothing to finish: a TFRecord file is its records."""


class TFRecordRows:
    """Rows ``[start, stop)`` of one TFRecord shard, the file kept open between reads.

    Records before a range are skipped by their length headers (their data is not read when the
    file can seek; a local file is skipped through unbuffered reads of the 12-byte headers, so a
    reader that starts in the middle of a shard reads little more than its own records); reading
    on from where the previous range ended needs no skip at all.
    """

    def __init__(self, url: str):
        self._url = url
        self._file = None
        self._next_record = 0

    def _open(self) -> None:
        if fs.is_local(self._url):
            path = self._url[len("file://"):] if self._url.startswith("file://") else self._url
            self._file = io.BufferedReader(open(path, "rb", buffering=0))
        else:
            self._file = fs.open_ranges(self._url)

    def _skip(self, n: int) -> int:
        if isinstance(self._file, io.BufferedReader) and n > 0:
            position = self._file.tell()
            raw = self._file.detach()  # what the buffer read ahead is dropped, not re-read
            raw.seek(position)
            skipped = skip_records(raw, n)
            self._file = io.BufferedReader(raw)
            return skipped
        return skip_records(self._file, n)

    def read(self, start: int, stop: int) -> InstanceBatch:
        if self._file is None or start < self._next_record:
            self.close()
            self._open()
        skipped = self._skip(start - self._next_record)
        self._next_record += skipped
        if self._next_record < start:
            raise ValueError(f"{self._url}: ends after {self._next_record} records, record {start} requested")
        records = list(itertools.islice(iter_tfrecord_records(self._file), stop - start))
        self._next_record += len(records)
        if len(records) < stop - start:
            raise ValueError(f"{self._url}: ends after {self._next_record} records, rows up to {stop} requested")
        return features_to_batch(decode_records(records))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._next_record = 0


FORMAT = OutputFormat(name="tfrecord", open_writer=TFRecordShardWriter, read_shard=read_tfrecord, open_rows=TFRecordRows)
