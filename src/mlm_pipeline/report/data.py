"""What ``mlm-pipeline report --json`` prints, and what the HTML page and the PNGs plot.

:func:`report_data` turns a manifest into one JSON-ready dictionary. A statistic the run did not
record is never shown as 0: it is left out of its section and listed under ``not_known`` with the
reason (reference mode runs the reference's own algorithm and records less; an output made by an
older version has no per-task timings or token counts; an objective without NSP has no
random-next share).
"""

from __future__ import annotations

from mlm_pipeline.errors import InspectError

REFERENCE_WHY = ("not tracked in reference mode: the reference implementation runs whole and "
                 "reports only its instances, tokens and masks")
OLDER_WHY = "not recorded in this output (written by an older version of mlm-pipeline)"
TOP_SHOWN = 25
"""Most frequent tokens listed (and plotted)."""

# statistics of the default mode that a reference-mode run does not record
_PAIR_DETAILS = ("short_target_documents", "truncated_pairs", "chunks_without_pair")


def histogram(totals: dict, name: str) -> dict[int, int] | None:
    """The histogram ``totals[name]`` (JSON's string keys) as whole numbers, in key order; None
    when not recorded. A key or count that is not a whole number (a damaged or edited manifest)
    raises :class:`InspectError` naming it, not a traceback."""
    counts = totals.get(name)
    if counts is None:
        return None
    if not isinstance(counts, dict):
        raise InspectError(f"manifest.json: totals.{name} is not a histogram (a {type(counts).__name__}); "
                           "the manifest is damaged or was edited")
    out = {}
    for key, value in counts.items():
        try:
            number, count = int(key), int(value)
        except (TypeError, ValueError, OverflowError):
            number = count = -1
        if number < 0 or count < 0 or isinstance(value, bool):
            raise InspectError(f"manifest.json: totals.{name} holds {str(key)[:80]!r}: {str(value)[:80]!r}, not a "
                               "count of a whole number >= 0; the manifest is damaged or was edited")
        out[number] = count
    return dict(sorted(out.items()))


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


NOTHING_READ_WHY = "no document was read"


def missing_why(manifest: dict) -> str:
    """Why a statistic of the default mode is not in a manifest's totals."""
    if not manifest.get("totals", {}).get("documents_read"):
        return NOTHING_READ_WHY
    return REFERENCE_WHY if manifest.get("reference_mode") else OLDER_WHY


def _token_section(manifest: dict, totals: dict, not_known: dict) -> dict:
    tokens = totals.get("tokens", 0)
    out: dict = {"tokens": tokens}
    if "unk_tokens" in totals:
        out["unk_tokens"] = totals["unk_tokens"]
        out["unk_rate"] = _share(totals["unk_tokens"], tokens)
    else:
        not_known["unk_rate"] = missing_why(manifest)
    if "top_token_counts" in totals:
        top = sorted(totals["top_token_counts"].items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_SHOWN]
        out["top_tokens"] = [{"token": t, "count": c, "share": _share(c, tokens)} for t, c in top]
        out["top_tokens_note"] = ("each task records its 500 most frequent input tokens and the run sums them: "
                                  "exact for tokens frequent in every task, a lower bound otherwise")
    else:
        not_known["top_tokens"] = missing_why(manifest)
    return out


def _pairs_section(manifest: dict, totals: dict, not_known: dict) -> dict:
    instances = totals.get("instances", 0)
    out: dict = {}
    if "random_next" in totals:
        out["random_next"] = totals["random_next"]
        out["actual_next"] = instances - totals["random_next"]
        out["random_next_share"] = _share(totals["random_next"], instances)
        for key in _PAIR_DETAILS:
            if key in totals:
                out[key] = totals[key]
            else:
                not_known[key] = missing_why(manifest)
    elif manifest.get("objective", "nsp") == "nsp":
        not_known["random_next_share"] = missing_why(manifest)
    else:
        not_known["random_next_share"] = f"the objective {manifest.get('objective')!r} makes no next-sentence pairs"
    for key in ("single_segment", "one_segment_draws", "random_target", "truncated_examples", "dropped_tokens"):
        if key in totals:  # ELECTRA's examples
            out[key] = totals[key]
    return out


def _masking_section(manifest: dict, totals: dict, not_known: dict) -> dict:
    masked, instances = totals.get("masked_tokens", 0), totals.get("instances", 0)
    if manifest.get("masking") not in (None, "static"):
        not_known["masked_per_instance"] = (f"masking {manifest.get('masking')!r}: the training loader masks at "
                                            "load time, the shards hold no masks")
        return {}
    return {
        "masked_tokens": masked,
        "masked_per_instance_mean": _share(masked, instances),
        "as_mask_token": _share(totals.get("masked_as_mask_token", 0), masked),
        "as_random_token": _share(totals.get("masked_as_random_token", 0), masked),
        "kept": _share(totals.get("masked_kept", 0), masked),
        "masked_per_instance_histogram": histogram(totals, "masked_per_instance_histogram"),
    }


def _length_section(manifest: dict, totals: dict) -> dict:
    hist = histogram(totals, "instance_length_histogram") or {}
    count = sum(hist.values())
    total = sum(k * v for k, v in hist.items())
    max_len = manifest.get("config", {}).get("max_seq_length")
    out = {"instance_length_histogram": hist, "max_seq_length": max_len,
           "mean_length": _share(total, count)}
    if max_len and count:
        out["padding_share"] = 1 - total / (count * max_len)  # of a TFRecord's fixed-size rows
        out["full_length_share"] = hist.get(max_len, 0) / count
    return out


def _task_section(manifest: dict, not_known: dict) -> list[dict]:
    rows = manifest.get("task_timings")
    if not rows or any(r.get("seconds") is None for r in rows):
        not_known["task_throughput"] = OLDER_WHY
        return []
    starts = [r["started"] for r in rows if r.get("started") is not None]
    t0 = min(starts) if starts else None
    out = []
    for r in rows:
        seconds = r["seconds"]
        out.append({**r, "start_offset": None if r.get("started") is None or t0 is None else r["started"] - t0,
                    "mb_per_s": _share(r["bytes_read"] / 1e6, seconds),
                    "tokens_per_s": _share(r["tokens"], seconds)})
    return out


def all_warnings(manifest: dict) -> list[str]:
    """Every warning the text report prints (the summary's and the random-next flag), as plain strings."""
    return [*random_next_warning(manifest), *warnings(manifest)]


def report_data(manifest: dict) -> dict:
    """Everything ``report`` shows, as plain JSON types; ``not_known`` maps each statistic the run
    did not record to the reason."""
    totals = manifest.get("totals", {})
    not_known: dict[str, str] = {}
    skipped_docs = dict(totals.get("documents_skipped", {}))
    data = {
        "run": {key: manifest.get(key) for key in ("version", "created", "format", "objective", "masking",
                                                    "reference_mode", "tokenizer_fingerprint", "tasks",
                                                    "split_bytes", "tokenizer_backend")},
        "input": {
            "files": len(manifest.get("inputs", [])),
            "bytes_read": totals.get("bytes_read", 0),
            "documents_read": totals.get("documents_read", 0),
            "sentences": totals.get("sentences", 0),
            "documents_with_replaced_bytes": totals.get("documents_with_replaced_bytes", 0),
        },
        "skips": {"documents": skipped_docs, "files": dict(totals.get("files_skipped", {})),
                  "skipped_files": manifest.get("skipped_files", [])},
        "output": {"instances": totals.get("instances", 0), "shards": totals.get("shards", 0),
                   "bytes_written": totals.get("bytes_written", 0)},
        "lengths": _length_section(manifest, totals),
    }
    data["tokens"] = _token_section(manifest, totals, not_known)
    data["pairs"] = _pairs_section(manifest, totals, not_known)
    data["masking"] = _masking_section(manifest, totals, not_known)
    data["tasks"] = _task_section(manifest, not_known)
    if manifest.get("languages") is not None:
        data["languages"] = language_section(manifest)
    data["settings"] = manifest.get("config", {})
    data["warnings"] = all_warnings(manifest)
    data["not_known"] = not_known
    data["totals"] = totals
    return data



def language_section(manifest: dict) -> dict:
    """Each language's tokens before sampling (read) and after (used, over the repeats; and in
    the instances written), with its shares and, with α, its target share and rate."""
    record = manifest["languages"]
    per = manifest.get("totals", {}).get("languages", {})
    read = sum(c.get("tokens", 0) for c in per.values())
    used = sum(c.get("sampled_tokens", 0) for c in per.values())
    written = sum(c.get("instance_tokens", 0) for c in per.values())
    rows = []
    for code, c in sorted(per.items()):
        row = {"language": code, "id": record.get("ids", {}).get(code),
               "tokens": c.get("tokens", 0), "share": _share(c.get("tokens", 0), read),
               "sampled_tokens": c.get("sampled_tokens", 0), "sampled_share": _share(c.get("sampled_tokens", 0), used),
               "instances": c.get("instances", 0), "instance_tokens": c.get("instance_tokens", 0),
               "instance_share": _share(c.get("instance_tokens", 0), written)}
        if record.get("alpha") is not None:
            row["target_share"] = record.get("target_shares", {}).get(code)
            row["rate"] = record.get("rates", {}).get(code)
        rows.append(row)
    return {"alpha": record.get("alpha"), "rows": rows}


UNKNOWN_SHARE_WARNING = 0.01
"""A run whose tokens are more than this share ``[UNK]`` gets a warning, with the words most often
read as ``[UNK]``: its vocabulary does not fit the text. Measured with bert-base-uncased: 0.004%
of the bundled WikiText sample read as text (9 CJK characters), 0.001% of the WikiExtractor one,
62.5% of the bundled Chinese one, 11.4% of the three together. The input's own unknown marks
(``unknown_marked``: WikiText's ``<unk>``, 2.8% of its sample's tokens) are no fault of the
vocabulary and not counted here. The warning fired only above 20% before: 6.6% passed silently."""
SHOWN_UNKNOWN_WORDS = 10
"""Words read as ``[UNK]`` named in that warning (the manifest keeps the run's 100 most frequent)."""


def warnings(manifest: dict) -> list[str]:
    """What about a finished run a user should hear: no documents at all, a vocabulary that
    turns much of the text into [UNK]."""
    t = manifest["totals"]
    out = []
    if not t.get("documents_read"):
        out.append("no document was read: every input was empty, blank or skipped (counts above)")
    # (the input's own unknown marks, WikiText's <unk>, are no fault of the vocabulary)
    tokens, unknown = t.get("tokens", 0), max(0, t.get("unk_tokens", 0) - t.get("unknown_marked", 0))
    if tokens and unknown / tokens > UNKNOWN_SHARE_WARNING:
        words = sorted(t.get("unknown_words", {}).items(), key=lambda kv: (-kv[1], kv[0]))[:SHOWN_UNKNOWN_WORDS]
        which = ("; the words most often read as [UNK] (in a sample of each task's text): "
                 + ", ".join(f"{w!r} {c:,}" for w, c in words)) if words else ""
        out.append(f"{unknown / tokens:.1%} of the tokens are [UNK]: the vocabulary does not fit this text "
                   "(another vocabulary, --do-lower-case to match it, or train one with mlm-pipeline vocab)" + which)
    documents, replaced = t.get("documents_read", 0), t.get("documents_with_replaced_bytes", 0)
    if documents and replaced / documents > REPLACED_SHARE_WARNING:
        out.append(f"{replaced:,} of the {documents:,} documents read ({replaced / documents:.0%}) had bytes that are "
                   "not UTF-8, replaced by U+FFFD and then dropped with the characters they were: is the input "
                   "in another encoding? Convert it first (iconv -f LATIN1 -t UTF-8 for Latin-1)")
    lost, read = lost_tokens(manifest)
    if read and lost / read > LOST_TOKENS_WARNING:
        out.append(f"{lost / read:.0%} of the tokens read ({lost:,} of {read:,}) are in no instance: "
                   + _lost_why(manifest))
    if cut := t.get("documents_cut", 0):
        out.append(f"documents longer than --block-size were cut into parts at line ends, {cut:,} time(s): a text "
                   "file with no blank line is one document, read by one task alone; Google's text format puts a "
                   "blank line between documents (a document per line: `sed G` puts a blank line after each line, and "
                   "--sentence-split splits the lines into sentences)")
    if cut := t.get("pages_cut", 0):
        out.append(f"{cut:,} Wikipedia dump page(s) longer than 8 MiB of XML were read up to that size only "
                   "(Wikipedia accepts 2 MiB of wikitext a page: is the dump damaged?)")
    return out


LOST_TOKENS_WARNING = 0.05
"""A run that leaves more than this share of the tokens it read out of every instance gets a
warning. Google's pairs, truncated as its script truncates them, lose 1.5% of 1 MB of WikiText-2
split into sentences at --max-seq-length 512 and 13% at 128; ELECTRA's examples drop 27% of a
Chinese novel and a WikiExtractor file read a paragraph per line at 128, 14% split into sentences."""


def lost_tokens(manifest: dict) -> tuple[int, int]:
    """(tokens read that no instance holds, tokens read), over every ``--dupe-factor`` pass, where
    the objective counts them: ELECTRA's examples drop what does not fit (``dropped_tokens``),
    BERT's pairs truncate (``truncated_tokens``); packing and tokens-only runs lose nothing."""
    t = manifest.get("totals", {})
    tokens = int(t.get("tokens", 0))
    if "dropped_tokens" in t:
        return int(t["dropped_tokens"]), tokens
    if "truncated_tokens" in t:
        passes = int(manifest.get("config", {}).get("dupe_factor") or 1)
        return int(t["truncated_tokens"]), tokens * passes
    return 0, tokens


def _lost_why(manifest: dict) -> str:
    config = manifest.get("config", {})
    t = manifest["totals"]
    how = ("sentences that do not fit in an example are cut at its end, as ELECTRA's script cuts them"
           if "dropped_tokens" in t else
           f"{t.get('truncated_pairs', 0):,} pairs longer than --max-seq-length were truncated, as Google's script "
           "truncates them")
    # (--sentence-split is for text files: the other formats split their paragraphs already)
    text_read = any(i.get("format", "text") == "text" for i in manifest.get("inputs", [{}]))
    fixes = ([] if config.get("sentence_split") or not text_read else
             ["if the text holds a paragraph per line, --sentence-split splits lines into sentences"])
    fixes.append(f"a larger --max-seq-length (now {config.get('max_seq_length')}) keeps more")
    return f"{how}; " + ", or ".join(fixes)


REPLACED_SHARE_WARNING = 0.01
"""A run in which more than this share of the documents had invalid UTF-8 gets a warning: a few
such documents are usual in web text, many mean a file in another encoding (Latin-1, cp1252)."""


RANDOM_NEXT_WARNING_SHARE = 0.70


def random_next_warning(manifest: dict) -> list[str]:
    """A flag when far more than half of the NSP pairs are random-next (Google's algorithm gives
    about half on documents of several sentences): a chunk of one sentence always gets a random
    next, so this is the sign of one-sentence documents, or of lines about as long as an instance
    (a paragraph per line read as a sentence per line)."""
    t = manifest["totals"]
    inst, random_next = t.get("instances", 0), t.get("random_next")
    if "single_segment" in t or not inst or random_next is None or random_next / inst <= RANDOM_NEXT_WARNING_SHARE:
        return []
    hint = ("" if manifest.get("config", {}).get("sentence_split") else
            "; for text with a paragraph per line, --sentence-split splits lines into sentences")
    return [f"{random_next / inst:.1%} of the pairs are random-next (over "
                f"{RANDOM_NEXT_WARNING_SHARE:.0%}): most pairs were cut from a single sentence (documents of one "
                f"sentence, or lines about as long as an instance){hint}"]


__all__ = ["LOST_TOKENS_WARNING", "histogram", "lost_tokens", "random_next_warning", "report_data", "warnings"]
