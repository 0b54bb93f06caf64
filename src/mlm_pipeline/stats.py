"""Counters a task reports and the manifest sums: nothing read is lost without a count."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ReadStats:
    """What a reader saw. ``documents_skipped`` maps a reason to a count.

    Reasons used by the readers: ``empty`` (a document with no text), ``invalid_utf8`` (with
    ``--on-decode-error skip``), ``binary`` (NUL bytes), ``line_too_long`` (a line over
    ``--max-line-bytes``), ``bad_record`` (JSONL line that is not a JSON object, or a record
    without the text field; a null Parquet value), ``outside_doc`` (a run of non-blank lines
    outside any ``<doc>`` block of a WikiExtractor file), ``no_tokens`` (every sentence
    tokenised to nothing); a Wikipedia dump's pages: ``namespace`` (a namespace not read, by
    ``<ns>``), ``redirect``, ``disambiguation`` (a disambiguation or set-index template),
    ``bad_page`` (a page without its ``</page>`` or ``</text>``: damaged XML) and ``empty`` (no
    text left after cleaning).
    """

    documents_read: int = 0
    sentences: int = 0
    bytes_read: int = 0
    documents_skipped: Counter = field(default_factory=Counter)
    documents_with_replaced_bytes: int = 0
    lone_cr_line_ends: int = 0  # lines ended by a lone \r (old Mac files), read as line ends
    documents_cut: int = 0  # cuts of documents longer than --block-size into parts (at line ends)
    pages_cut: int = 0  # Wikipedia dump pages longer than the page cap, read up to it
    trailing_bytes_ignored: int = 0  # bytes after a bz2 dump's last stream that are not bz2 data
    unknown_marked: int = 0  # words the input itself marks unknown (WikiText's <unk>), read as the unknown token
    documents_without_id: int = 0  # records without the --id-field (kept, with the empty string as id)

    def count_document(self, sentences: list[str], replaced: bool) -> bool:
        """Count a document a reader gives out; False (and a skip, ``empty``) when it has no
        sentence, which the reader then drops."""
        return bool(self.count_documents([sentences], replaced))

    def count_documents(self, documents: list[list[str]], replaced: bool) -> list[list[str]]:
        """:meth:`count_document` for many at once: the documents that have a sentence."""
        kept = documents if all(documents) else [d for d in documents if d]
        if len(kept) < len(documents):
            self.skip("empty", len(documents) - len(kept))
        self.documents_read += len(kept)
        self.sentences += sum(map(len, kept))
        if replaced:
            self.documents_with_replaced_bytes += len(kept)
        return kept

    def skip(self, reason: str, n: int = 1) -> None:
        self.documents_skipped[reason] += n

    def to_dict(self) -> dict:
        return {
            "documents_read": self.documents_read,
            "sentences": self.sentences,
            "bytes_read": self.bytes_read,
            "documents_skipped": dict(sorted(self.documents_skipped.items())),
            "documents_with_replaced_bytes": self.documents_with_replaced_bytes,
            # (only when there are some: the totals of ordinary corpora keep their keys)
            **({"lone_cr_line_ends": self.lone_cr_line_ends} if self.lone_cr_line_ends else {}),
            **({"documents_cut": self.documents_cut} if self.documents_cut else {}),
            **({"pages_cut": self.pages_cut} if self.pages_cut else {}),
            **({"trailing_bytes_ignored": self.trailing_bytes_ignored} if self.trailing_bytes_ignored else {}),
            **({"unknown_marked": self.unknown_marked} if self.unknown_marked else {}),
            **({"documents_without_id": self.documents_without_id} if self.documents_without_id else {}),
        }


def merge_counts(dicts: list[dict]) -> dict:
    """Sum nested count dictionaries (per-task stats into run totals)."""
    out: dict = {}
    for d in dicts:
        add_counts(out, d)
    return out


def add_counts(into: dict, d: dict) -> None:
    """Add the nested counts of ``d`` to ``into``, in place (a run's totals grow task by task
    without keeping every task's stats); other values are left out, and ``d`` is never shared."""
    get = into.get
    for k, v in d.items():
        kind = type(v)
        if kind is int or kind is float:  # (exact types first: 160 counts a task, 200,000 tasks)
            into[k] = get(k, 0) + v
        elif isinstance(v, dict):
            add_counts(into.setdefault(k, {}), v)
        elif isinstance(v, (int, float)):
            into[k] = get(k, 0) + v
