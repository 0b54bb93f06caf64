"""Reference mode: the instances google-research/bert's ``create_pretraining_data.py`` writes.

What it guarantees
------------------
For ONE input file, the same flags (``max_seq_length``, ``max_predictions_per_seq``,
``masked_lm_prob``, ``dupe_factor``, ``short_seq_prob``, ``do_whole_word_mask``, ``do_lower_case``),
the same WordPiece vocab and the same ``random_seed``, :func:`reference_instances_for_file` returns
the instances the reference script (commit ``eedf5716``) writes to ONE output file: same count,
same order, and every feature of every instance equal once padded (``InstanceBatch.padded``).
The golden cases in ``tests/data/golden`` check this instance by instance.

How: one ``random.Random(random_seed)`` is driven through exactly the reference's sequence of
calls (document shuffle; per document the short-target draw; per chunk the ``a_end`` draw, the
random-next coin, up to ten random-document draws and the start sentence, one draw per truncated
token; per instance the candidate shuffle and one to three draws per masked token; the final
instance shuffle). Everything that does not consume random numbers is done differently: segments
are ``[start, end)`` ranges into one flat token array (truncation moves an end, it never copies),
candidate shuffles permute ``range(n)``, and the ragged output arrays are assembled in one
vectorised pass at the end.

Reading follows TensorFlow's ``GFile.readline`` and the reference's tokenizer, not Python's:
lines end at ``\\n`` only and every ``\\r`` is dropped (TF's line reader skips them, even inside
a line); bytes are decoded as UTF-8 with invalid bytes ignored; literal ``[SEP]``/``[MASK]``...
in the text are split like any other text (the Google tokenizer has no special-token matching);
words longer than 200 characters become ``[UNK]`` (Google's WordPiece limit, HF's default is 100);
a word-final capital sigma lower-cases to ``ς`` (Python's ``str.lower``, which Google uses).

What it costs
-------------
Like the reference it holds the whole file's tokenized documents in memory (a random-next segment
can come from anywhere in the file) and runs on one core: the random-call sequence is inherently
sequential. Measured on ``sample/wikitext2-train-1MB.txt`` (1.0 MB, 2-core VM, Python 3.11,
tokenizers 0.23, tokenizer already loaded), read + tokenize + build:

    dupe 2, seq 128 (3,795 instances):             0.39-0.51 s, ~2-2.5 MB/s
                                                   (tokenize 0.27-0.37 s, build 0.12-0.20 s)
    whole-word, seq 512, dupe 1 (1,462 instances): 0.37-0.65 s, ~1.5-2.7 MB/s
                                                   (tokenize 0.26-0.48 s, build 0.10-0.19 s)
    (ranges over runs on a VM shared with other jobs)
    peak RSS growth: ~21-25 MB per MB of input, mostly the HF ``Encoding`` objects of the one
    batched tokenizer call; the built instances themselves are a few MB.

Building scales with ``dupe_factor`` (~30 us per instance); memory with the input file. Reference
mode is for reproducing and checking, not for big corpora: the sharded BERT builder is the
production path.
"""

from __future__ import annotations

import functools
import json
import random
import unicodedata
from bisect import bisect_left
from typing import Callable, Iterable, Sequence

import fsspec
import numpy as np
from tokenizers import Tokenizer

from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets, ranges_to_indices
from mlm_pipeline.stats import ReadStats
from mlm_pipeline.tokenize import TextTokenizer, encode_ids

# Google's WordpieceTokenizer turns words longer than this into [UNK] (HF's default is 100).
REFERENCE_MAX_INPUT_CHARS_PER_WORD = 200


# --------------------------------------------------------------------------------------------
# Reading and tokenizing
# --------------------------------------------------------------------------------------------


def split_reference_lines(text: str) -> list[str]:
    """Cut text into lines the way the reference's ``tf.gfile.GFile.readline`` does.

    Lines end at ``\\n`` only (not at ``\\r``, ``\\x0b``, ``\\u2028``... as ``str.splitlines`` or
    Python's text mode would), and every ``\\r`` is dropped, also in the middle of a line.
    """
    return text.replace("\r", "").split("\n")


def read_reference_documents(lines: Iterable[str]) -> list[list[str]]:
    """Documents as lists of sentence strings, parsed like the reference.

    Every line is stripped (``str.strip``, i.e. Python's idea of whitespace); a line that is then
    empty ends the current document; any other line is a sentence of the current document. The
    first document starts before the first line. Give lines as :func:`split_reference_lines`
    cuts them (``\\r`` is dropped here too). Documents without any line are left out; sentences
    are kept even if they will tokenize to nothing (:func:`tokenize_reference_documents` drops
    those, and then any document left empty, as the reference does).
    """
    documents: list[list[str]] = [[]]
    for line in lines:
        line = line.replace("\r", "").strip()
        if line:
            documents[-1].append(line)
        elif documents[-1]:
            documents.append([])
    if not documents[-1]:
        documents.pop()
    return documents


@functools.lru_cache(maxsize=4)
def _reference_tokenizer(tokenizer: TextTokenizer) -> tuple[Tokenizer, bool]:
    """The same tokenizer made to split like Google's, and whether it lower-cases.

    Two changes: no added-token matching (HF matches ``[SEP]``, ``[MASK]``... in the raw text as
    single tokens; Google's BasicTokenizer splits them into ``[``, ``sep``, ``]``) and Google's
    200-character word limit instead of HF's 100.
    """
    spec = json.loads(tokenizer.tokenizer.to_str())
    spec["added_tokens"] = []
    model = spec.get("model") or {}
    if model.get("type") == "WordPiece":
        model["max_input_chars_per_word"] = REFERENCE_MAX_INPUT_CHARS_PER_WORD
    normalizer = spec.get("normalizer") or {}
    lowercases = normalizer.get("type") == "BertNormalizer" and bool(normalizer.get("lowercase"))
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.no_truncation()
    tok.no_padding()
    return tok, lowercases


def _google_lower(text: str) -> str:
    """Lower-case like Google's BasicTokenizer: Python's ``str.lower`` after its text cleaning.

    Only needed where the two lower-casings differ: Python turns a word-final capital sigma into
    ``ς``, HF's per-character lower-casing always gives ``σ``. The characters Google's cleaning
    removes (NUL, U+FFFD, control and format characters) are removed first because they change
    what counts as word-final; HF would remove them anyway.
    """
    return "".join(
        c
        for c in text
        if not (c == "\ufffd" or (c not in "\t\n\r" and unicodedata.category(c) in ("Cc", "Cf")))
    ).lower()


def tokenize_reference_documents(
    documents: Sequence[Sequence[str]], tokenizer: TextTokenizer
) -> list[list[np.ndarray]]:
    """Tokenize every sentence in batched calls; drop empty sentences, then empty documents.

    Returns, per kept document, one int32 id array per kept sentence (views into one flat array).
    """
    sentences = [s for doc in documents for s in doc]
    if not sentences:
        return []
    tok, lowercases = _reference_tokenizer(tokenizer)
    if lowercases:
        sentences = [_google_lower(s) if "\u03a3" in s else s for s in sentences]
    flat, lengths = encode_ids(tok, sentences)
    offsets = lengths_to_offsets(lengths).tolist()
    out: list[list[np.ndarray]] = []
    k = 0
    for doc in documents:
        kept = [flat[offsets[j] : offsets[j + 1]] for j in range(k, k + len(doc)) if offsets[j + 1] > offsets[j]]
        k += len(doc)
        if kept:
            out.append(kept)
    return out


def reference_continuation_table(tokens: Sequence[str]) -> np.ndarray:
    """``True`` for ids whose vocab string starts with ``##`` (the reference's exact test)."""
    return np.fromiter((t.startswith("##") for t in tokens), dtype=bool, count=len(tokens))


def _vocab_strings(tokenizer: TextTokenizer) -> list[str]:
    """Vocab strings by id; ids must be 0..n-1 without gaps, as the reference's line numbers."""
    vocab = tokenizer.tokenizer.get_vocab(with_added_tokens=True)
    if len(vocab) != max(vocab.values(), default=-1) + 1:
        raise ValueError(
            f"tokenizer {tokenizer.path}: {len(vocab)} vocab entries for ids up to {max(vocab.values())}; "
            "reference mode needs a vocab without duplicate entries (id = line number in vocab.txt)"
        )
    strings = [""] * len(vocab)
    for t, i in vocab.items():
        strings[i] = t
    return strings


# --------------------------------------------------------------------------------------------
# Instance creation
# --------------------------------------------------------------------------------------------


def _check_settings(
    *,
    vocab_size: int,
    max_seq_length: int,
    dupe_factor: int,
    short_seq_prob: float,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
) -> None:
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if max_seq_length < 5:
        raise ValueError(
            f"max_seq_length must be >= 5 ([CLS] A [SEP] B [SEP] with a target of at least 2), got {max_seq_length}"
        )
    if dupe_factor < 0:
        raise ValueError(f"dupe_factor must be >= 0, got {dupe_factor}")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise ValueError(f"short_seq_prob must be in [0, 1], got {short_seq_prob}")
    if not 0.0 <= masked_lm_prob <= 1.0:
        raise ValueError(f"masked_lm_prob must be in [0, 1], got {masked_lm_prob}")
    if max_predictions_per_seq < 0:
        raise ValueError(f"max_predictions_per_seq must be >= 0, got {max_predictions_per_seq}")


def create_reference_instances(
    documents: list[list[np.ndarray]],
    *,
    vocab_size: int,
    cls_id: int,
    sep_id: int,
    mask_id: int,
    is_continuation: np.ndarray,
    max_seq_length: int,
    dupe_factor: int,
    short_seq_prob: float,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    do_whole_word_mask: bool,
    random_seed: int,
) -> InstanceBatch:
    """The reference's ``create_training_instances`` on already tokenized documents.

    ``documents`` must be what the reference keeps: non-empty documents of non-empty sentences,
    in file order (:func:`tokenize_reference_documents` gives that). ``vocab_size`` is the number
    of vocab entries (a random replacement is id ``randint(0, vocab_size - 1)``);
    ``is_continuation[id]`` says whether the id's string starts with ``##``.
    """
    _check_settings(
        vocab_size=vocab_size,
        max_seq_length=max_seq_length,
        dupe_factor=dupe_factor,
        short_seq_prob=short_seq_prob,
        masked_lm_prob=masked_lm_prob,
        max_predictions_per_seq=max_predictions_per_seq,
    )
    # Per document the offsets of its sentence boundaries in one flat token array.
    bounds: list[list[int]] = []
    pos = 0
    for d, doc in enumerate(documents):
        if not len(doc):
            raise ValueError(f"document {d} is empty (the reference drops empty documents first)")
        b = [pos]
        for s, sent in enumerate(doc):
            if not len(sent):
                raise ValueError(f"sentence {s} of document {d} is empty (the reference drops those)")
            pos += len(sent)
            b.append(pos)
        bounds.append(b)
    flat = (
        np.concatenate([np.asarray(s, dtype=np.int32) for doc in documents for s in doc])
        if documents
        else np.zeros(0, np.int32)
    )

    rng = random.Random(random_seed)
    # rng.shuffle's draws depend only on the length, so shuffling an index list is equivalent.
    order = list(range(len(documents)))
    rng.shuffle(order)
    bounds = [bounds[i] for i in order]

    n_docs = len(bounds)
    max_num_tokens = max_seq_length - 3
    cont = np.asarray(is_continuation, dtype=bool)[flat] if do_whole_word_mask else None

    rand = rng.random
    randint = rng.randint
    shuffle = rng.shuffle

    # Per instance: A range, B range, label. Per masked token: instance, position, replacement
    # (-1 keeps the original token).
    a_starts: list[int] = []
    a_ends: list[int] = []
    b_starts: list[int] = []
    b_ends: list[int] = []
    labels: list[int] = []
    m_inst: list[int] = []
    m_pos: list[int] = []
    m_repl: list[int] = []

    for _ in range(dupe_factor):
        for doc_index in range(n_docs):
            cum = bounds[doc_index]
            n_sent = len(cum) - 1
            target = max_num_tokens
            if rand() < short_seq_prob:
                target = randint(2, max_num_tokens)

            chunk_first = 0
            i = 0
            while i < n_sent:
                if i == n_sent - 1 or cum[i + 1] - cum[chunk_first] >= target:
                    n_chunk = i - chunk_first + 1
                    a_end = randint(1, n_chunk - 1) if n_chunk >= 2 else 1
                    a_s = cum[chunk_first]
                    a_e = cum[chunk_first + a_end]
                    if n_chunk == 1 or rand() < 0.5:
                        label = 1
                        target_b = target - (a_e - a_s)
                        for _ in range(10):
                            r = randint(0, n_docs - 1)
                            if r != doc_index:
                                break
                        rcum = bounds[r]
                        rn = len(rcum) - 1
                        start = randint(0, rn - 1)
                        b_s = rcum[start]
                        b_e = rcum[bisect_left(rcum, b_s + target_b, start + 1, rn)]
                        i -= n_chunk - a_end
                    else:
                        label = 0
                        b_s = a_e
                        b_e = cum[i + 1]

                    la = a_e - a_s
                    lb = b_e - b_s
                    while la + lb > max_num_tokens:
                        if la > lb:
                            if rand() < 0.5:
                                a_s += 1
                            else:
                                a_e -= 1
                            la -= 1
                        else:
                            if rand() < 0.5:
                                b_s += 1
                            else:
                                b_e -= 1
                            lb -= 1

                    inst = len(labels)
                    a_starts.append(a_s)
                    a_ends.append(a_e)
                    b_starts.append(b_s)
                    b_ends.append(b_e)
                    labels.append(label)

                    # Masking. Candidate c (0-based over A then B) sits at position c + 1 in A
                    # and c + 2 in B ([CLS] before A, [SEP] between).
                    num_to_predict = min(
                        max_predictions_per_seq, max(1, int(round((la + lb + 3) * masked_lm_prob)))
                    )
                    # Which candidates get masked uses no random numbers beyond the shuffle, so
                    # choose them first, then draw 80/10/10 for each in the order chosen.
                    n_cand = la + lb
                    if cont is None:
                        chosen = list(range(n_cand))
                        shuffle(chosen)
                        del chosen[num_to_predict:]
                    else:
                        # A word starts at each candidate that is not a '##' piece, and at the
                        # first; a '##' piece right after the middle [SEP] joins A's last word.
                        piece_is_cont = np.concatenate((cont[a_s:a_e], cont[b_s:b_e]))
                        piece_is_cont[0] = False
                        w_start = np.flatnonzero(~piece_is_cont).tolist()
                        w_start.append(n_cand)
                        words = list(range(len(w_start) - 1))
                        shuffle(words)
                        chosen = []
                        for w in words:
                            if len(chosen) >= num_to_predict:
                                break
                            lo = w_start[w]
                            hi = w_start[w + 1]
                            if len(chosen) + hi - lo <= num_to_predict:
                                chosen.extend(range(lo, hi))
                    for c in chosen:
                        m_inst.append(inst)
                        m_pos.append(c + 1 if c < la else c + 2)
                        if rand() < 0.8:
                            m_repl.append(mask_id)
                        elif rand() < 0.5:
                            m_repl.append(-1)
                        else:
                            m_repl.append(randint(0, vocab_size - 1))
                    chunk_first = i + 1
                i += 1

    final_order = list(range(len(labels)))
    shuffle(final_order)

    batch = _assemble(
        flat,
        np.array(a_starts, np.int64),
        np.array(a_ends, np.int64),
        np.array(b_starts, np.int64),
        np.array(b_ends, np.int64),
        np.array(labels, np.int8),
        np.array(m_inst, np.int64),
        np.array(m_pos, np.int64),
        np.array(m_repl, np.int64),
        cls_id=cls_id,
        sep_id=sep_id,
    )
    return batch.take(np.array(final_order, np.int64))


def _assemble(
    flat: np.ndarray,
    a_s: np.ndarray,
    a_e: np.ndarray,
    b_s: np.ndarray,
    b_e: np.ndarray,
    labels: np.ndarray,
    m_inst: np.ndarray,
    m_pos: np.ndarray,
    m_repl: np.ndarray,
    *,
    cls_id: int,
    sep_id: int,
) -> InstanceBatch:
    """Build ``[CLS] A [SEP] B [SEP]`` rows and apply the masking decisions, all vectorised."""
    n = len(labels)
    la = a_e - a_s
    lb = b_e - b_s
    lengths = la + lb + 3
    offsets = lengths_to_offsets(lengths)
    starts = offsets[:-1]
    input_ids = np.empty(int(offsets[-1]), np.int32)
    input_ids[starts] = cls_id
    input_ids[starts + la + 1] = sep_id
    input_ids[offsets[1:] - 1] = sep_id
    input_ids[ranges_to_indices(starts + 1, la)] = flat[ranges_to_indices(a_s, la)]
    input_ids[ranges_to_indices(starts + la + 2, lb)] = flat[ranges_to_indices(b_s, lb)]
    segment_ids = np.zeros(len(input_ids), np.int8)
    segment_ids[ranges_to_indices(starts + la + 2, lb + 1)] = 1

    order = np.lexsort((m_pos, m_inst))
    m_inst = m_inst[order]
    m_pos = m_pos[order]
    m_repl = m_repl[order]
    where = starts[m_inst] + m_pos
    masked_ids = input_ids[where]
    input_ids[where] = np.where(m_repl >= 0, m_repl, masked_ids)
    masked_counts = np.bincount(m_inst, minlength=n)
    return InstanceBatch(
        input_ids=input_ids,
        segment_ids=segment_ids,
        offsets=offsets,
        masked_lm_positions=m_pos.astype(np.int32),
        masked_lm_ids=masked_ids.astype(np.int32),
        masked_offsets=lengths_to_offsets(masked_counts),
        next_sentence_labels=labels,
    )


def reference_instances_for_file(
    path: str,
    tokenizer: TextTokenizer,
    *,
    max_seq_length: int = 128,
    max_predictions_per_seq: int = 20,
    masked_lm_prob: float = 0.15,
    dupe_factor: int = 10,
    short_seq_prob: float = 0.1,
    do_whole_word_mask: bool = False,
    random_seed: int = 12345,
    stats: ReadStats | None = None,
) -> InstanceBatch:
    """Reference mode for one file (local path or fsspec URL; ``.gz`` etc. decompressed).

    Defaults are the reference script's flag defaults. ``stats``, if given, receives the counts
    of bytes, documents and sentences read.

    The tokenizer must be the WordPiece vocab the reference used, with the same
    ``do_lower_case``; its vocab entries must be unique (then an id is its line in vocab.txt,
    as in the reference).
    """
    with fsspec.open(path, "rb", compression="infer") as f:
        raw = f.read()
    text = raw.decode("utf-8", errors="ignore")
    documents = tokenize_reference_documents(
        read_reference_documents(split_reference_lines(text)), tokenizer
    )
    del text
    if stats is not None:
        stats.bytes_read += len(raw)
        stats.documents_read += len(documents)
        stats.sentences += sum(len(d) for d in documents)
    del raw
    vocab = _vocab_strings(tokenizer)
    return create_reference_instances(
        documents,
        vocab_size=len(vocab),
        cls_id=tokenizer.special.cls,
        sep_id=tokenizer.special.sep,
        mask_id=tokenizer.special.mask,
        is_continuation=reference_continuation_table(vocab),
        max_seq_length=max_seq_length,
        dupe_factor=dupe_factor,
        short_seq_prob=short_seq_prob,
        masked_lm_prob=masked_lm_prob,
        max_predictions_per_seq=max_predictions_per_seq,
        do_whole_word_mask=do_whole_word_mask,
        random_seed=random_seed,
    )


# --------------------------------------------------------------------------------------------
# Comparing against golden output
# --------------------------------------------------------------------------------------------

FEATURES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)


def decode_padded_instance(
    features: dict[str, np.ndarray], index: int, convert_ids_to_tokens: Callable[[Sequence[int]], list[str]]
) -> str:
    """One padded instance as readable text; masked positions show ``{shown->label}``."""
    n = int(np.asarray(features["input_mask"][index]).sum())
    ids = np.asarray(features["input_ids"][index][:n]).tolist()
    tokens = convert_ids_to_tokens(ids)
    k = int((np.asarray(features["masked_lm_weights"][index]) > 0).sum())
    positions = np.asarray(features["masked_lm_positions"][index][:k]).tolist()
    labels = convert_ids_to_tokens(np.asarray(features["masked_lm_ids"][index][:k]).tolist())
    for p, lab in zip(positions, labels):
        if 0 <= p < n:
            tokens[p] = "{" + tokens[p] + "->" + lab + "}"
    seg = np.asarray(features["segment_ids"][index][:n])
    nsp = int(np.asarray(features["next_sentence_labels"][index]).reshape(-1)[0])
    return (
        f"  length {n}, segment A {int((seg == 0).sum())} / B {int((seg == 1).sum())}, "
        f"next_sentence_label {nsp}, masked {k} at {positions}\n  " + " ".join(tokens)
    )


def describe_first_difference(
    actual: dict[str, np.ndarray],
    expected: dict[str, np.ndarray],
    convert_ids_to_tokens: Callable[[Sequence[int]], list[str]],
) -> str | None:
    """``None`` when all padded features are equal, else a report of the first differing instance.

    The report names the instance index, every feature that differs there (with the first
    differing column) and both instances decoded to tokens with their masked positions visible.
    """
    n_act = len(actual["input_ids"])
    n_exp = len(expected["input_ids"])
    lines = []
    if n_act != n_exp:
        lines.append(f"instance count differs: actual {n_act}, expected {n_exp}")
    for name in FEATURES:
        a, e = np.asarray(actual[name]), np.asarray(expected[name])
        if a.shape[1:] != e.shape[1:]:
            lines.append(f"feature {name} has row shape {a.shape[1:]} (actual) vs {e.shape[1:]} (expected)")
    if lines:
        return "\n".join(lines)
    m = min(n_act, n_exp)
    row_differs = np.zeros(m, bool)
    for name in FEATURES:
        a = np.asarray(actual[name])[:m].reshape(m, -1)
        e = np.asarray(expected[name])[:m].reshape(m, -1)
        row_differs |= (a != e).any(axis=1)
    if not row_differs.any():
        return None
    i = int(np.argmax(row_differs))
    lines.append(f"first differing instance: {i} (of {m}; {int(row_differs.sum())} differ in all)")
    for name in FEATURES:
        a = np.asarray(actual[name][i]).reshape(-1)
        e = np.asarray(expected[name][i]).reshape(-1)
        if (a != e).any():
            col = int(np.argmax(a != e))
            lines.append(f"  feature {name} differs, first at column {col}: actual {a[col].item()!r}, expected {e[col].item()!r}")
    lines.append("actual:")
    lines.append(decode_padded_instance(actual, i, convert_ids_to_tokens))
    lines.append("expected:")
    lines.append(decode_padded_instance(expected, i, convert_ids_to_tokens))
    return "\n".join(lines)
