"""Comparing instances with golden outputs of a reference script, instance by instance.

Goldens are JSON lines of padded features (one instance a line, file order) beside a JSON file of
the settings that made them. A mismatch is reported as the first differing instance, the
features that differ there, and both instances decoded to tokens with their masks visible.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

FEATURES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)


ALBERT_FEATURES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "token_boundary",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)


def load_golden(folder: Path, name: str, features: Sequence[str] = FEATURES) -> tuple[dict, dict[str, np.ndarray]]:
    """``(settings, padded features)`` of golden case ``name`` in ``folder``."""
    settings = json.loads((folder / f"{name}.json").read_text())
    with gzip.open(folder / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return settings, {k: np.array([r[k] for r in rows]) for k in features}


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
    features: Sequence[str] = FEATURES,
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
    for name in features:
        a, e = np.asarray(actual[name]), np.asarray(expected[name])
        if a.shape[1:] != e.shape[1:]:
            lines.append(f"feature {name} has row shape {a.shape[1:]} (actual) vs {e.shape[1:]} (expected)")
    if lines:
        return "\n".join(lines)
    m = min(n_act, n_exp)
    row_differs = np.zeros(m, bool)
    for name in features:
        a = np.asarray(actual[name])[:m].reshape(m, -1)
        e = np.asarray(expected[name])[:m].reshape(m, -1)
        row_differs |= (a != e).any(axis=1)
    if not row_differs.any():
        return None
    i = int(np.argmax(row_differs))
    lines.append(f"first differing instance: {i} (of {m}; {int(row_differs.sum())} differ in all)")
    for name in features:
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
