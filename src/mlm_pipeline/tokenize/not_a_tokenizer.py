"""What a file given as a tokenizer is instead, in words that name the fix.

HF's own errors name neither the file nor what to give (a text file given as the vocab said
"sep_token not found in the vocabulary", a JSON file of another kind a parse error at a column):
``loading.py`` adds these to its errors.
"""

from __future__ import annotations

import json
from pathlib import Path

WHAT_A_TOKENIZER_IS = (
    "a tokenizer is a WordPiece vocab.txt (one token per line, with [CLS], [SEP], [MASK] and [UNK]), a "
    "tokenizer.json, a SentencePiece .model, a model directory holding one of them, or a hub model name such as "
    "bert-base-uncased"
)
"""Said with every error about a file that is no tokenizer (the library's own words name no fix)."""


def not_a_vocab(path: str) -> str:
    """What a file given as a WordPiece vocab.txt is instead, from its first lines."""
    try:
        with open(path, "rb") as f:
            head = f.read(64 * 1024)
    except OSError as exc:
        return f"cannot read {path} ({exc})"
    lines = [ln.strip() for ln in head.decode("utf-8", "replace").splitlines() if ln.strip()]
    wordy = sum(1 for ln in lines if len(ln.split()) > 1)
    if lines and wordy > 0.1 * len(lines):
        return f"{path} looks like text ({wordy} of its first {len(lines)} lines hold several words), not a vocabulary"
    present = set(lines)
    missing = [t for t in ("[CLS]", "[SEP]", "[MASK]", "[UNK]") if t not in present]
    if missing and not {"<s>", "</s>"} & present:
        return f"{path} is no BERT vocabulary: it has no line {', '.join(missing)}"
    return f"{path} is not a WordPiece vocabulary HF can load"


def not_a_tokenizer_json(path: str, exc: Exception) -> str:
    """What a ``.json`` file given as a tokenizer is instead: invalid JSON, or JSON of another kind."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return f"{path} is not a tokenizer.json: not valid JSON ({err})"
    if not isinstance(doc, dict) or "model" not in doc:
        keys = ", ".join(list(doc)[:5]) if isinstance(doc, dict) else type(doc).__name__
        return (f"{path} is JSON but not a tokenizer.json (it holds {keys or 'nothing'}; a tokenizer.json holds "
                "'model', 'normalizer', 'pre_tokenizer', ...)")
    return f"cannot load tokenizer.json {path}: {exc}"


__all__ = ["WHAT_A_TOKENIZER_IS", "not_a_tokenizer_json", "not_a_vocab"]
