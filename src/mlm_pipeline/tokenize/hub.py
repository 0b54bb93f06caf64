"""Tokenizers named by their Hugging Face hub id (``-t bert-base-uncased``).

A name that is not a local path but reads as a hub id (``name`` or ``org/name``, not ending in
``.txt`` or ``.json``) is looked up with ``huggingface_hub``: from the local HF cache
(``HF_HOME``, ``HF_HUB_CACHE``), downloaded into it when the network allows, or, with
``HF_HUB_OFFLINE=1`` and nothing cached, refused with a message that says how to get it. Only
the tokenizer's files are fetched, never the weights; the directory they land in is then read as
any local model directory (``tokenizer.json`` first, else ``vocab.txt`` with its
``tokenizer_config.json``).
"""

from __future__ import annotations

import os
import re

from mlm_pipeline.errors import TokenizerError

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def looks_like_hub_name(name: str) -> bool:
    """``bert-base-uncased`` or ``google/electra-small-discriminator``, not ``tok/vocab.txt``."""
    return bool(_HUB_ID.fullmatch(name)) and not name.endswith((".txt", ".json")) and ".." not in name


def hub_tokenizer_dir(name: str) -> str:
    """The local directory holding the tokenizer files of hub model ``name`` (fetched if needed)."""
    try:
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:  # pragma: no cover - a dependency of tokenizers
        raise TokenizerError(f"tokenizer {name!r} is not a local path, and huggingface_hub is not installed "
                             "to look it up on the Hugging Face hub") from None
    found: dict[str, str] = {}
    unreachable: Exception | None = None
    for filename in TOKENIZER_FILES:
        try:
            found[filename] = hf_hub_download(name, filename)
        except LocalEntryNotFoundError as exc:  # offline (or the hub unreachable) and not cached
            unreachable = exc
        except RepositoryNotFoundError:
            raise TokenizerError(f"tokenizer {name!r} is neither a local path nor a model on the Hugging Face hub "
                                 "(or one that needs a login: run `hf auth login`)") from None
        except EntryNotFoundError:  # the repository has no such file
            continue
        except OSError as exc:  # network errors
            unreachable = exc
    for main in ("tokenizer.json", "vocab.txt"):
        if main in found:
            return os.path.dirname(found[main])
    if unreachable is None:
        raise TokenizerError(f"hub model {name!r} has neither tokenizer.json nor vocab.txt")
    why = ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE
           else f"the hub could not be reached ({type(unreachable).__name__})")
    raise TokenizerError(
        f"tokenizer {name!r} is not a local path and not in the Hugging Face cache ({constants.HF_HUB_CACHE}), "
        f"and {why}. Fetch it once where the network allows: `hf download {name} {' '.join(TOKENIZER_FILES)}` "
        f"(into the same cache, or copy the cache), or unset HF_HUB_OFFLINE, or pass a local vocab.txt, "
        f"tokenizer.json or model directory with -t")
