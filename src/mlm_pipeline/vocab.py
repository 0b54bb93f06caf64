"""``mlm-pipeline vocab``: train a WordPiece vocabulary from a corpus, deterministically.

Why not HF's ``WordPieceTrainer`` alone: it is not deterministic (the same call gives a
different vocabulary from one run to the next, because subword ids are handed out in hash-map
order and ties between equally frequent pairs are then broken by those ids), and its fixed
``limit_alphabet`` drops rare characters however much text they carry (1,000 characters kept
only 92% of a Chinese novel's characters). So the counting and the merges are done here, with
every tie broken by the token strings, and the result is handed to HF's ``WordPiece`` model, so
the ``tokenizer.json`` written is a plain HF tokenizer.

The training follows WordPiece-as-trained-by-HF (BPE merges on words split into a first
character and ``##``-prefixed continuation characters, most frequent pair first):

1. normalise and pre-tokenise every document with the same HF normaliser and pre-tokeniser the
   resulting tokenizer uses, and count words (memory bounded by ``max_words``: past it, the
   rarest words are pruned — counts of the words kept stay exact from then on);
2. choose the alphabet by *character coverage*: the most frequent characters that together
   make up ``character_coverage`` of all character occurrences (as SentencePiece does);
3. merge the most frequent adjacent pair until the vocabulary has ``vocab_size`` entries.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from mlm_pipeline.errors import ConfigError

log = logging.getLogger("mlm_pipeline")

BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PREFIX = "##"
MAX_WORD_CHARS = 100  # HF WordPiece's max_input_chars_per_word: longer words encode as [UNK]


@dataclass(frozen=True)
class VocabSettings:
    """What decides the vocabulary (recorded beside it)."""

    vocab_size: int = 30522
    lowercase: bool = True
    strip_accents: bool | None = None  # None: strip when lower-casing (BERT's rule)
    flavor: str = "bert"  # "electra": also delete every Unicode category C* character
    character_coverage: float = 0.9995
    min_frequency: int = 2
    max_words: int = 4_000_000
    special_tokens: tuple[str, ...] = BERT_SPECIAL_TOKENS

    def __post_init__(self) -> None:
        if not 0.0 < self.character_coverage <= 1.0:
            raise ConfigError(f"character coverage must be in (0, 1], got {self.character_coverage}")
        if self.vocab_size < len(self.special_tokens) + 1:
            raise ConfigError(f"vocab size {self.vocab_size} leaves no room beside the special tokens")
        if self.flavor not in ("bert", "electra"):
            raise ConfigError(f"tokenizer flavor must be bert or electra, got {self.flavor!r}")
        if self.min_frequency < 1 or self.max_words < 1000:
            raise ConfigError("min frequency must be >= 1 and max words >= 1000")


@dataclass
class VocabReport:
    """What training saw and chose: printed by the CLI, written as ``vocab-report.json``."""

    settings: dict
    documents: int = 0
    words_counted: int = 0
    distinct_words: int = 0
    pruned_words: int = 0
    distinct_characters: int = 0
    alphabet_size: int = 0
    character_coverage: float = 0.0
    merges: int = 0
    vocab_size: int = 0
    short_of_size: str | None = None  # why vocab_size is below the size asked (settings' vocab_size)
    files: list[str] = field(default_factory=list)


def bert_normalizer(settings: VocabSettings) -> normalizers.Normalizer:
    strip = settings.lowercase if settings.strip_accents is None else settings.strip_accents
    bert = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=strip,
                                      lowercase=settings.lowercase)
    if settings.flavor == "electra":
        # ELECTRA deletes every "other" character (Cc, Cf, Cn, Co, Cs), BERT only controls
        return normalizers.Sequence([normalizers.Replace(_category_c_regex(), ""), bert])
    return bert


def _category_c_regex():
    from tokenizers import Regex

    return Regex(r"\p{C}")


class WordCounter:
    """Word frequencies of normalised, pre-tokenised text, in bounded memory."""

    def __init__(self, settings: VocabSettings):
        self.normalizer = bert_normalizer(settings)
        self.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        self.max_words = settings.max_words
        self.counts: Counter[str] = Counter()
        self.pruned = 0
        self.documents = 0

    def add_document(self, sentences: list[str]) -> None:
        text = self.normalizer.normalize_str("\n".join(sentences))
        self.counts.update(w for w, _ in self.pre_tokenizer.pre_tokenize_str(text))
        self.documents += 1
        if len(self.counts) > self.max_words:
            self._prune()

    def _prune(self) -> None:
        """Drop the rarest words until at most half of ``max_words`` remain (ties by string)."""
        keep = self.max_words // 2
        ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        self.pruned += len(ranked) - keep
        self.counts = Counter(dict(ranked[:keep]))


def choose_alphabet(word_counts: dict[str, int], coverage: float) -> tuple[list[str], float, int]:
    """The most frequent characters covering ``coverage`` of all occurrences (ties by code point)."""
    chars: Counter[str] = Counter()
    for word, count in word_counts.items():
        for ch in word:
            chars[ch] += count
    total = sum(chars.values())
    ranked = sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))
    kept, covered = [], 0
    for ch, count in ranked:
        if total and covered / total >= coverage:
            break
        kept.append(ch)
        covered += count
    return kept, (covered / total if total else 1.0), len(chars)


def _merged(left: str, right: str) -> str:
    return left + right[len(PREFIX):] if right.startswith(PREFIX) else left + right


def train_wordpiece(word_counts: dict[str, int], settings: VocabSettings) -> tuple[list[str], VocabReport]:
    """The vocabulary (in id order) for ``word_counts``; deterministic for equal inputs."""
    report = VocabReport(settings=asdict(settings))
    alphabet, report.character_coverage, report.distinct_characters = choose_alphabet(
        word_counts, settings.character_coverage)
    allowed = set(alphabet)
    vocab: list[str] = list(settings.special_tokens)
    ids: dict[str, int] = {t: i for i, t in enumerate(vocab)}

    def token_id(tok: str) -> int:
        if tok not in ids:
            ids[tok] = len(vocab)
            vocab.append(tok)
        return ids[tok]

    for ch in alphabet:
        token_id(ch)
    # words made of kept characters, as symbol-id lists: first char, then ##-continuations
    continuation = sorted({ch for w in word_counts if len(w) <= MAX_WORD_CHARS and set(w) <= allowed
                           for ch in w[1:]}, key=alphabet.index)
    for ch in continuation:
        token_id(PREFIX + ch)
    report.alphabet_size = len(alphabet)
    if len(vocab) > settings.vocab_size:
        raise ConfigError(
            f"the alphabet alone needs {len(vocab)} entries ({len(alphabet)} characters and "
            f"{len(continuation)} continuations), more than --vocab-size {settings.vocab_size}: "
            f"raise the size or lower --character-coverage")

    words: list[list[int]] = []
    freqs: list[int] = []
    for w in sorted(word_counts):
        if len(w) <= MAX_WORD_CHARS and set(w) <= allowed:
            words.append([ids[w[0]]] + [ids[PREFIX + c] for c in w[1:]])
            freqs.append(word_counts[w])

    pair_counts: Counter[tuple[int, int]] = Counter()
    where: dict[tuple[int, int], set[int]] = {}
    for wi, (symbols, f) in enumerate(zip(words, freqs)):
        for pair in zip(symbols, symbols[1:]):
            pair_counts[pair] += f
            where.setdefault(pair, set()).add(wi)
    # max-heap by count; equal counts by the pair's strings: never by ids or hash order
    heap = [(-c, vocab[a], vocab[b], a, b) for (a, b), c in pair_counts.items()]
    heapq.heapify(heap)
    while len(vocab) < settings.vocab_size and heap:
        negc, _, _, a, b = heapq.heappop(heap)
        if pair_counts.get((a, b), 0) != -negc:
            continue  # stale entry; the current count was pushed when it changed
        if -negc < settings.min_frequency:
            report.short_of_size = (f"no pair of pieces is seen {settings.min_frequency} times (--min-frequency) "
                                    "any more")
            break
        new = token_id(_merged(vocab[a], vocab[b]))
        report.merges += 1
        changed: set[tuple[int, int]] = set()
        for wi in where.pop((a, b), ()):
            old = words[wi]
            out, i = [], 0
            while i < len(old):
                if i + 1 < len(old) and old[i] == a and old[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(old[i])
                    i += 1
            f = freqs[wi]
            old_pairs, new_pairs = list(zip(old, old[1:])), list(zip(out, out[1:]))
            for p in old_pairs:
                pair_counts[p] -= f
                changed.add(p)
            for p in new_pairs:
                pair_counts[p] += f
                where.setdefault(p, set()).add(wi)
                changed.add(p)
            for p in set(old_pairs) - set(new_pairs):
                if p != (a, b):
                    where.get(p, set()).discard(wi)
            words[wi] = out
        pair_counts.pop((a, b), None)
        for p in changed:
            c = pair_counts.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, vocab[p[0]], vocab[p[1]], p[0], p[1]))
            else:
                pair_counts.pop(p, None)
    report.vocab_size = len(vocab)
    if report.vocab_size < settings.vocab_size and report.short_of_size is None:
        report.short_of_size = "every word is a single piece already"
    if report.short_of_size is not None:
        report.short_of_size = (f"{report.vocab_size:,} entries, fewer than the {settings.vocab_size:,} asked: "
                                f"{report.short_of_size}; more text (or a smaller size) gives the size asked")
        log.warning("%s", report.short_of_size)
    return vocab, report


def build_tokenizer(vocab: list[str], settings: VocabSettings) -> Tokenizer:
    """An HF WordPiece tokenizer (BERT pre-tokenisation and [CLS]/[SEP] template) for ``vocab``."""
    ids = {t: i for i, t in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(vocab=ids, unk_token="[UNK]", continuing_subword_prefix=PREFIX,
                                     max_input_chars_per_word=MAX_WORD_CHARS))
    tok.normalizer = bert_normalizer(settings)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    tok.decoder = decoders.WordPiece(prefix=PREFIX)
    tok.add_special_tokens(list(settings.special_tokens))
    return tok


def output_paths(output: str) -> tuple[Path, Path, Path]:
    """``tokenizer.json``, ``vocab.txt`` and ``vocab-report.json`` for ``-o`` (a .json file or a directory)."""
    out = Path(output)
    folder = out.parent if out.suffix == ".json" else out
    tok_json = out if out.suffix == ".json" else out / "tokenizer.json"
    return tok_json, folder / "vocab.txt", folder / "vocab-report.json"


def writable_output_paths(output: str) -> tuple[Path, Path, Path]:
    """:func:`output_paths`, once it is clear their folder can be made and written: checked before
    the corpus is read (so a wrong ``-o`` costs a second, not a whole training), creating nothing."""
    paths = output_paths(output)
    folder = paths[1].parent
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder} is a file: -o takes a directory, or a path ending in .json for tokenizer.json")
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "is a file" if not existing.is_dir() else "cannot be written"
        raise ConfigError(f"cannot write the vocabulary into {folder}: {existing} {why}")
    return paths


def iter_corpus_documents(inputs: list[str], input_format: str = "auto") -> Iterator[list[str]]:
    """Documents of every input through the same readers ``prepare`` uses (formats, compression, URLs)."""
    from mlm_pipeline import fs
    from mlm_pipeline.plan import usable_inputs, warn_skipped
    from mlm_pipeline.read import ReadOptions, get_input_format, iter_documents
    from mlm_pipeline.stats import ReadStats

    options, stats = ReadOptions(), ReadStats()
    usable, skipped = usable_inputs(sorted(fs.expand_inputs(inputs)), input_format, options)
    warn_skipped(skipped, more="for the same reasons")
    for f in usable:  # empty, binary and side files are skipped exactly as prepare skips them
        for piece in get_input_format(f.fmt).split(f.url, f.size, f.size, options):
            yield from iter_documents(piece, options, stats)


def train_vocab(documents: Iterable[list[str]], output: str, settings: VocabSettings) -> VocabReport:
    """Count, train and write ``tokenizer.json``, ``vocab.txt`` and ``vocab-report.json``."""
    tok_json, vocab_txt, report_json = writable_output_paths(output)
    counter = WordCounter(settings)
    for doc in documents:
        counter.add_document(doc)
    if not counter.counts:
        raise ConfigError("no text to train a vocabulary on: the inputs hold no words")
    vocab, report = train_wordpiece(counter.counts, settings)
    report.documents = counter.documents
    report.words_counted = sum(counter.counts.values())
    report.distinct_words = len(counter.counts)
    report.pruned_words = counter.pruned
    report.files = [str(tok_json), str(vocab_txt), str(report_json)]
    tokenizer = build_tokenizer(vocab, settings)
    try:
        tok_json.parent.mkdir(parents=True, exist_ok=True)
        write_together({tok_json: lambda tmp: tokenizer.save(str(tmp)),
                        vocab_txt: lambda tmp: tmp.write_text("".join(t + "\n" for t in vocab), encoding="utf-8"),
                        report_json: lambda tmp: tmp.write_text(json.dumps(asdict(report), indent=1,
                                                                           ensure_ascii=False) + "\n",
                                                                encoding="utf-8")})
    except OSError as exc:  # (what the early check cannot see: a special filesystem, a full disk)
        raise ConfigError(f"cannot write the vocabulary into {vocab_txt.parent}: {exc}") from None
    return report


def write_together(writers: dict[Path, Callable[[Path], object]]) -> None:
    """Each file of ``writers`` written by its function to a temporary name beside it, flushed to
    disk, and only once every one is whole, renamed to its name: a write that fails (a full disk)
    leaves no file under its final name half written (a truncated ``vocab.txt`` beside a whole
    ``tokenizer.json`` was used by ``prepare -t`` without complaint), and any file of an earlier
    run as it was. The temporary files are removed whatever happens."""
    tmps: dict[Path, Path] = {}
    try:
        for final, write in writers.items():
            tmps[final] = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex}")
            write(tmps[final])
            fd = os.open(tmps[final], os.O_RDONLY)
            try:
                os.fsync(fd)  # (a full disk can refuse the data only here)
            finally:
                os.close(fd)
        for final, tmp in tmps.items():
            os.replace(tmp, final)
    finally:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
