"""Human-readable summaries of a manifest: what was read, skipped and produced."""

from __future__ import annotations

import shlex

from mlm_pipeline.report.data import (NOTHING_READ_WHY, OLDER_WHY, histogram, language_section,
                                        random_next_warning, warnings)

SHOWN_FILES = 10
"""Skipped input files listed by name (the rest are counted)."""


def _hist_lines(hist: dict, *, bins: int = 8, width: int = 40) -> list[str]:
    if not hist:
        return ["    (none)"]
    items = sorted((int(k), int(v)) for k, v in hist.items())
    lo, hi = items[0][0], items[-1][0]
    step = max(1, -(-(hi - lo + 1) // bins))
    buckets: dict[int, int] = {}
    for k, v in items:
        b = lo + (k - lo) // step * step
        buckets[b] = buckets.get(b, 0) + v
    top = max(buckets.values()) or 1  # (every count 0: a hand-made manifest)
    total = sum(buckets.values()) or 1
    # every bin from the lowest to the highest, an empty one as a row of 0 (a gap was hidden)
    return [
        f"    {b:>5}-{min(b + step - 1, hi):<5} {'#' * (max(1, round(width * v / top)) if v else 0):<{width}} "
        f"{v:>9,} ({v / total:5.1%})"
        for b, v in ((b, buckets.get(b, 0)) for b in range(lo, hi + 1, step))
    ]


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "n/a"


def render_summary(manifest: dict, output: str, *, wrote: bool = True) -> str:
    """A few lines on an output; ``wrote=False`` when this command found it written already."""
    t = manifest["totals"]
    skipped = t.get("documents_skipped", {})
    skipped_text = ", ".join(f"{k} {v:,}" for k, v in sorted(skipped.items())) or "none"
    files_skipped = t.get("files_skipped", {})
    lines = [
        (f"wrote {t.get('instances', 0):,} instances in {t.get('shards', 0)} shard(s), "
         f"{t.get('bytes_written', 0) / 1e6:,.1f} MB -> {output}" if wrote else
         f"{output} holds {t.get('instances', 0):,} instances in {t.get('shards', 0)} shard(s), "
         f"{t.get('bytes_written', 0) / 1e6:,.1f} MB"),
        f"  documents read {t.get('documents_read', 0):,}; skipped: {skipped_text}",
        f"  sentences {t.get('sentences', 0):,}, tokens {t.get('tokens', 0):,}, "
        f"masked tokens {t.get('masked_tokens', 0):,}",
    ]
    if files_skipped:
        lines.append("  files skipped: " + ", ".join(f"{k} {v}" for k, v in sorted(files_skipped.items())))
    lines += _megatron_lines(t)
    lines += [f"  warning: {w}" for w in warnings(manifest)]
    lines.append(f"  details: mlm-pipeline report {shlex.quote(output)}; examples: mlm-pipeline inspect {shlex.quote(output)}")
    return "\n".join(lines)


PLANNED_FILES = 10
"""Input files a dry run's plan names; the rest are counted."""


def render_plan(plan: dict, output: str) -> str:
    """What ``prepare --dry-run`` found (:func:`~mlm_pipeline.pipeline.plan_prepare`)."""
    files = plan["files"]
    lines = [f"plan: {plan['tasks']} task(s), {plan['input_bytes']:,} bytes in {len(files)} input file(s) "
             f"(split size {plan['split_bytes']:,} bytes); {len(plan['skipped_files'])} file(s) skipped"]
    lines += [f"  {f['path']}  {f['bytes']:,} bytes, {f['format']}, {f['pieces']} piece(s)"
              + (f", language {f['language']}" if "language" in f else "") for f in files[:PLANNED_FILES]]
    if len(files) > PLANNED_FILES:
        lines.append(f"  ... and {len(files) - PLANNED_FILES} more")
    lines.append(f"dry run: nothing written; without --dry-run the run writes into {output}")
    return "\n".join(lines)


UNTRACKED = "not tracked in reference mode"


def _count(t: dict, key: str, note: str = UNTRACKED) -> str:
    """A count of the totals, or why there is none (reference modes count less than the default)."""
    return f"{t[key]:,}" if key in t else note


def _pair_lines(t: dict) -> list[str]:
    inst = t.get("instances", 0)
    lines = [f"  random-next (NSP label 1): {t.get('random_next', 0):,} ({_share(t.get('random_next', 0), inst)})"]
    if "short_target_documents" not in t and "truncated_pairs" not in t:
        lines.append(f"  documents with a short target length, truncated pairs: {UNTRACKED}")
    else:
        lines.append(f"  documents with a short target length: {_count(t, 'short_target_documents')}; "
                     f"truncated pairs: {_count(t, 'truncated_pairs')}")
    return lines


def _masking_lines(manifest: dict, t: dict) -> list[str]:
    """How masks were drawn, or that the shards hold none (the training loader masks them)."""
    if manifest.get("format") == "megatron":
        return ["  masks: none in the shards: Megatron masks as it builds its samples"]
    if manifest.get("masking") == "none":
        return ["  masks: none in the shards (--masking none): the training loader masks at load time"]
    masked, inst = t.get("masked_tokens", 0), t.get("instances", 0)
    return [
        f"  masked tokens {masked:,} ({masked / max(1, inst):.2f} per instance): "
        f"[MASK] {_share(t.get('masked_as_mask_token', 0), masked)}, "
        f"random {_share(t.get('masked_as_random_token', 0), masked)}, "
        f"kept {_share(t.get('masked_kept', 0), masked)}",
    ]


def _electra_lines(t: dict) -> list[str]:
    """ELECTRA examples: their segment and target-length draws (masking happens at training)."""
    inst = t.get("instances", 0)
    return [
        f"  one segment: {t['single_segment']:,} ({_share(t['single_segment'], inst)}); drawn as one segment "
        f"{t.get('one_segment_draws', 0):,} ({_share(t.get('one_segment_draws', 0), inst)})",
        f"  random target length: {t.get('random_target', 0):,} ({_share(t.get('random_target', 0), inst)}); "
        f"truncated examples {t.get('truncated_examples', 0):,}, tokens dropped {t.get('dropped_tokens', 0):,}",
    ]


def _packing_lines(manifest: dict, t: dict) -> list[str]:
    """``packed``: the padding its rows need to reach ``--max-seq-length`` and, best-fit, its pieces."""
    if "padding_tokens" not in t:
        return []
    config = manifest.get("config", {})
    slots = t.get("instances", 0) * (config.get("max_seq_length") or 0)
    lines = [f"  padding to --max-seq-length: {t['padding_tokens']:,} tokens "
             f"({t['padding_tokens'] / slots if slots else 0:.2%} of the rows' positions; packing "
             f"{config.get('packing', 'sentences')}{'' if config.get('cross_document', True) else ', no cross-document'})"]
    if "document_pieces" in t:
        lines.append(f"  documents placed as {t['document_pieces']:,} pieces; {t.get('documents_split', 0):,} "
                     "documents longer than a row split")
    return lines


def render_report(manifest: dict) -> str:
    t = manifest["totals"]
    inst = t.get("instances", 0)
    lines = [
        f"mlm-pipeline {manifest.get('version')}  format {manifest.get('format')}  "
        f"objective {manifest.get('objective')}{'  (reference mode)' if manifest.get('reference_mode') else ''}",
        f"tokenizer fingerprint {manifest.get('tokenizer_fingerprint', '')[:16]}",
        "",
        "input",
        f"  files {len(manifest.get('inputs', []))}, skipped files {len(manifest.get('skipped_files', []))}, "
        f"bytes read {t.get('bytes_read', 0):,}",
    ]
    for f in manifest.get("skipped_files", [])[:SHOWN_FILES]:
        lines.append(f"    skipped {f['path']}: {f['reason']}" + (f" ({f['detail']})" if f.get("detail") else ""))
    read, skipped = t.get("documents_read", 0), t.get("documents_skipped", {})
    lines.append(f"  documents seen {read + sum(skipped.values()):,}: read {read:,}, skipped {sum(skipped.values()):,}")
    for reason, count in sorted(skipped.items()):
        lines.append(f"    skipped documents ({reason}): {count:,}")
    lines.append(f"  sentences {t.get('sentences', 0):,}, tokens of the documents read {t.get('tokens', 0):,}")
    if t.get("documents_with_replaced_bytes"):
        lines.append(f"  documents with invalid UTF-8 replaced: {t['documents_with_replaced_bytes']:,}")
    lines += _token_lines(t, manifest)
    lines += [
        "",
        "output",
        f"  instances {inst:,} in {t.get('shards', 0)} shards ({t.get('bytes_written', 0):,} bytes)",
        *(_electra_lines(t) if "single_segment" in t else _pair_lines(t) if "random_next" in t else []),
        *_packing_lines(manifest, t),
        *_megatron_lines(t),
        *_masking_lines(manifest, t),
        *_language_lines(manifest),
        "",
        "instance length (tokens incl. [CLS]/[SEP])",
        *_hist_lines(histogram(t, "instance_length_histogram") or {}),
    ]
    if manifest.get("masking") != "none":
        lines += ["", "masked positions per instance", *_hist_lines(histogram(t, "masked_per_instance_histogram") or {})]
    lines += [line for w in random_next_warning(manifest) for line in ("", f"warning: {w}")]
    lines += [line for w in warnings(manifest) for line in ("", f"warning: {w}")]
    return "\n".join(lines)


def _megatron_lines(t: dict) -> list[str]:
    """``--format megatron``: its sequences, and the documents megatron-core's BERT dataset leaves out."""
    if "megatron_sequences" not in t:
        return []
    one, long = t.get("megatron_one_sentence_documents", 0), t.get("megatron_long_sentence_documents", 0)
    return [f"  megatron: {t['megatron_sequences']:,} sequences in {t.get('instances', 0):,} documents; Megatron BERT "
            f"leaves out {long:,} document(s) with a sentence over 512 tokens, and {one:,} of one sentence "
            "unless --bert-no-binary-head"]


SHOWN_TOKENS = 12


def _language_lines(manifest: dict) -> list[str]:
    """Each language's tokens before and after sampling (runs with languages)."""
    if manifest.get("languages") is None:
        return []
    section = language_section(manifest)
    alpha = section["alpha"]
    lines = ["", f"languages ({'--language-alpha ' + format(alpha, 'g') if alpha is not None else 'natural mix'}): "
             "tokens read -> used (over repeats) -> in instances"]
    pct = lambda v: "n/a" if v is None else f"{v:.1%}"  # noqa: E731
    for r in section["rows"]:
        target = f", target {pct(r['target_share'])}, x{r['rate']:.3g}" if alpha is not None else ""
        lines.append(f"  {r['language']} (id {r['id']}): {r['tokens']:,} ({pct(r['share'])}) -> {r['sampled_tokens']:,} "
                     f"({pct(r['sampled_share'])}{target}) -> {r['instance_tokens']:,} in {r['instances']:,} instances "
                     f"({pct(r['instance_share'])})")
    return lines


def _token_lines(t: dict, manifest: dict) -> list[str]:
    """The [UNK] share and the most frequent input tokens, where the run counted them."""
    if "unk_tokens" not in t:
        why = NOTHING_READ_WHY if not t.get("documents_read") else UNTRACKED if manifest.get("reference_mode") \
            else OLDER_WHY
        return [f"  [UNK] tokens, most frequent tokens: {why}"]
    top = sorted(t.get("top_token_counts", {}).items(), key=lambda kv: (-kv[1], kv[0]))[:SHOWN_TOKENS]
    unk, tokens = t["unk_tokens"], t.get("tokens", 0)
    marked = f"; {t['unknown_marked']:,} of them marked unknown in the input" if t.get("unknown_marked") else ""
    return [f"  [UNK] tokens {unk:,} ({f'{unk / tokens:.3%}' if tokens else 'n/a'} of the tokens{marked})",
            "  most frequent tokens: " + (", ".join(f"{k} {v:,}" for k, v in top) or "(none)")]
