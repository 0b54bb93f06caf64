"""How google-research/bert's ``create_pretraining_data.py`` reads and tokenizes text.

Its input loop (the first part of ``create_training_instances``) and its ``FullTokenizer`` differ
from Python's text mode and from HF ``tokenizers`` in a few places that change instances:

* lines come from TensorFlow's ``GFile.readline``: they end at ``\\n`` only and every ``\\r``
  is dropped (TF's line reader skips them, even inside a line); bytes are decoded as UTF-8 with
  invalid bytes ignored; every line is ``str.strip()``-ped and a blank line ends a document;
* literal ``[SEP]``/``[MASK]``... in the text are split like any other text (the Google tokenizer
  has no special-token matching);
* words longer than 200 characters become ``[UNK]`` (Google's WordPiece limit, HF's is 100);
* a word-final capital sigma lower-cases to ``ς`` (Python's ``str.lower``, which Google uses);
* characters are classed, lower-cased and decomposed by Python's ``unicodedata``, not HF's
  tables: a private-use character is kept (its word becomes ``[UNK]``), some 760 marks,
  punctuation and format characters of recent Unicode versions split otherwise, 55 capitals of
  Unicode 15-16 stay as they are, and runs of combining marks keep Python's canonical order. A
  sentence holding such a character is encoded by Google's rules with Python's tables
  (``tokenize/google_rules.py``), every other one by the fast encoder;
* a vocab id is its line number in ``vocab.txt``, and a piece is a continuation when its string
  starts with ``##``.
"""

from __future__ import annotations

import functools
import json
from typing import Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer

from mlm_pipeline.errors import TokenizerError
from mlm_pipeline.instances.batch import lengths_to_offsets
from mlm_pipeline.tokenize import TextTokenizer
from mlm_pipeline.tokenize.google_rules import CAPITAL_SIGMA, GoogleRulesRouter, google_lower, google_rules_of
from mlm_pipeline.tokenize.loading import CheckedEncoder
from mlm_pipeline.tokenize.selfcheck import check_budget, first_texts

# Google's WordpieceTokenizer turns words longer than this into [UNK] (HF's default is 100).
REFERENCE_MAX_INPUT_CHARS_PER_WORD = 200


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
def _reference_tokenizer(tokenizer: TextTokenizer) -> tuple[CheckedEncoder, bool]:
    """The same tokenizer made to split like Google's, its fastest exact encoder, and whether it
    lower-cases.

    Two changes: no added-token matching (HF matches ``[SEP]``, ``[MASK]``... in the raw text as
    single tokens; Google's BasicTokenizer splits them into ``[``, ``sep``, ``]``) and Google's
    200-character word limit instead of HF's 100. The encoder is chosen as the pipeline's is
    (the backend asked for, self-checked against HF on the probe set; each file's first texts
    are checked again), so the reference's ids are HF's whichever backend encodes.
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
    return CheckedEncoder(tok, tokenizer.backend_info["requested"]), lowercases


@functools.lru_cache(maxsize=4)
def _google_router(tokenizer: TextTokenizer) -> GoogleRulesRouter | None:
    """What routes sentences that HF's tables split otherwise than Google's (None when the
    tokenizer is not Google's BERT tokenizer as HF writes it: then HF's splitting is kept)."""
    rules = google_rules_of(json.loads(tokenizer.tokenizer.to_str()))
    return None if rules is None else GoogleRulesRouter(_reference_tokenizer(tokenizer)[0].reference.tokenizer, *rules)


def google_tokenizer_warning(tokenizer: TextTokenizer) -> str | None:
    """Why ``tokenizer`` cannot give the tokens of Google's tokenizer, if so: it is not Google's
    BERT tokenizer as HF writes it (``google_rules.google_rules_of``), so it splits by its own
    rules. None for the ``electra`` flavor, which follows ELECTRA's tokenizer by construction.
    A SentencePiece model is refused: Google's script reads a WordPiece vocabulary only."""
    if getattr(tokenizer, "sentencepiece", None) is not None:
        raise TokenizerError(f"--reference reproduces Google's BERT script here, which reads a WordPiece vocab.txt; "
                             f"{tokenizer.path} is a SentencePiece model (drop --reference: the default mode "
                             "builds the same kind of instances with it)")
    if tokenizer.flavor != "bert" or _google_router(tokenizer) is not None:
        return None
    return (f"--reference: the tokenizer {tokenizer.path} is not Google's BERT tokenizer as HF writes it "
            "(BertNormalizer cleaning text and spacing CJK, stripping accents exactly when lower-casing; "
            "BertPreTokenizer; WordPiece), so its own rules split the text: the instances follow "
            "create_pretraining_data.py's algorithm on this tokenizer's tokens, not its output")


def tokenize_reference_documents(
    documents: Sequence[Sequence[str]], tokenizer: TextTokenizer, *, where: str = "reference",
    backend: dict | None = None,
) -> list[list[np.ndarray]]:
    """Tokenize every sentence in batched calls; drop empty sentences, then empty documents.

    Returns, per kept document, one int32 id array per kept sentence (views into one flat array).
    ``where`` names the input in a backend warning; ``backend``, if given, receives what encoded
    (the task marker's record).
    """
    sentences = [s for doc in documents for s in doc]
    if not sentences:
        return []
    flat, offsets = tokenize_reference_sentences(sentences, tokenizer, where=where, backend=backend)
    offsets = offsets.tolist()
    out: list[list[np.ndarray]] = []
    k = 0
    for doc in documents:
        kept = [flat[offsets[j] : offsets[j + 1]] for j in range(k, k + len(doc)) if offsets[j + 1] > offsets[j]]
        k += len(doc)
        if kept:
            out.append(kept)
    return out


def tokenize_reference_sentences(
    sentences: list[str], tokenizer: TextTokenizer, *, where: str = "reference", backend: dict | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Each sentence's ids by Google's ``FullTokenizer`` rules, in batched calls: (flat int32 ids,
    offsets int64 [sentences + 1]). Sentences may be empty or tokenize to nothing (length 0)."""
    if not sentences:
        return np.zeros(0, np.int32), np.zeros(1, np.int64)
    encoder, lowercases = _reference_tokenizer(tokenizer)
    if lowercases:
        sentences = [google_lower(s, "bert") if CAPITAL_SIGMA in s else s for s in sentences]
    router = _google_router(tokenizer)
    routed = set(router.routed(sentences)) if router is not None else set()
    # the fast encoder never sees a routed sentence (HF's tables may need an [UNK] there)
    fast = [s for j, s in enumerate(sentences) if j not in routed] if routed else sentences
    encoder.begin_task()  # each file's own first texts decide for it, whatever ran before in this process
    encoder.check_block(first_texts([fast], check_budget(sum(map(len, fast)))), where)
    flat, lengths = encoder.encode_batch(fast) if fast else (np.zeros(0, np.int32), np.zeros(0, np.int64))
    if backend is not None:
        backend.update(encoder.info)
    if routed:
        offsets = lengths_to_offsets(lengths).tolist()
        google = iter(router.encode([s for j, s in enumerate(sentences) if j in routed]))
        fast_ids = (flat[offsets[j] : offsets[j + 1]] for j in range(len(fast)))
        parts = [next(google) if j in routed else next(fast_ids) for j in range(len(sentences))]
        flat = np.concatenate(parts).astype(flat.dtype, copy=False)
        lengths = np.array([len(p) for p in parts], dtype=np.int64)
    return flat, lengths_to_offsets(lengths)


def vocab_strings(tokenizer: TextTokenizer) -> list[str]:
    """Vocab strings by id; ids must be 0..n-1 without gaps, as the reference's line numbers."""
    vocab = tokenizer.tokenizer.get_vocab(with_added_tokens=True)
    if len(vocab) != max(vocab.values(), default=-1) + 1:
        raise TokenizerError(
            f"tokenizer {tokenizer.path}: {len(vocab)} vocab entries for ids up to {max(vocab.values())}; "
            "reference mode needs a vocab without duplicate entries (id = line number in vocab.txt)"
        )
    strings = [""] * len(vocab)
    for t, i in vocab.items():
        strings[i] = t
    return strings


def reference_continuation_table(tokens: Sequence[str]) -> np.ndarray:
    """``True`` for ids whose vocab string starts with ``##`` (the reference's exact test)."""
    return np.fromiter((t.startswith("##") for t in tokens), dtype=bool, count=len(tokens))
