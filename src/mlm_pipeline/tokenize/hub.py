"""Tokenizers named by their Hugging Face hub id (``-t bert-base-uncased``).

A name that is not a local path but reads as a hub id (``name`` or ``org/name``, not ending in
``.txt``, ``.json`` or ``.model``) is looked up with ``huggingface_hub``: from the local HF cache
(``HF_HOME``, ``HF_HUB_CACHE``), downloaded into it when the network allows, or, with
``HF_HUB_OFFLINE=1`` or the hub out of reach and nothing cached, refused at once with a message
that says how to get it. Only the tokenizer's files are fetched, never the weights; the directory
they land in is then read as any local model directory (``tokenizer.json`` first, else
``vocab.txt`` with its ``tokenizer_config.json``; ALBERT's, XLM-R's, CamemBERT's and T5's by their
SentencePiece model: see ``spm.py``).
"""

from __future__ import annotations

import os
import re

from mlm_pipeline.errors import TokenizerError
from mlm_pipeline.tokenize.spm import MODEL_FILES

# config.json: its model_type tells an ALBERT, XLM-R, CamemBERT or T5 model (spm.directory_model)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", *MODEL_FILES, "config.json")

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def looks_like_hub_name(name: str) -> bool:
    """``bert-base-uncased`` or ``google/electra-small-discriminator``, not ``tok/vocab.txt``."""
    return bool(_HUB_ID.fullmatch(name)) and not name.endswith((".txt", ".json", ".model")) and ".." not in name


def hub_tokenizer_dir(name: str) -> str:
    """The local directory holding the tokenizer files of hub model ``name`` (fetched if needed).

    One quick request first asks whether the hub answers at all. ``hf_hub_download``, when the hub
    cannot be reached and the file is not cached, retries with a long timeout and backoff (about 23 s
    a file), so without a network each name took over a minute to be refused. When the probe gets no
    answer, the files are looked up in the cache only (``local_files_only``), which takes no time.
    """
    try:
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:  # pragma: no cover - a dependency of tokenizers
        raise TokenizerError(f"tokenizer {name!r} is not a local path, and huggingface_hub is not installed "
                             "to look it up on the Hugging Face hub") from None
    unreachable = None if constants.HF_HUB_OFFLINE else _probe_hub(name)
    found: dict[str, str] = {}
    for filename in TOKENIZER_FILES:
        try:
            found[filename] = hf_hub_download(name, filename,
                                              local_files_only=constants.HF_HUB_OFFLINE or unreachable is not None)
        except LocalEntryNotFoundError as exc:  # offline (or the hub unreachable) and not cached
            unreachable = unreachable or exc
        except RepositoryNotFoundError:
            raise TokenizerError(f"tokenizer {name!r} is neither a local path nor a model on the Hugging Face hub "
                                 "(or one that needs a login: run `hf auth login`)") from None
        except EntryNotFoundError:  # the repository has no such file
            continue
        except OSError as exc:  # network errors
            unreachable = unreachable or exc
    for main in ("tokenizer.json", "vocab.txt", *MODEL_FILES):
        if main in found:
            return os.path.dirname(found[main])
    if unreachable is None:
        raise TokenizerError(f"hub model {name!r} has no tokenizer.json, vocab.txt or SentencePiece model "
                             f"({', '.join(MODEL_FILES)})")
    if constants.HF_HUB_OFFLINE:
        why, unset = "HF_HUB_OFFLINE is set", ", or unset HF_HUB_OFFLINE"
    else:
        why, unset = f"the hub ({constants.ENDPOINT}) could not be reached ({_brief(unreachable)})", ""
    raise TokenizerError(
        f"tokenizer {name!r}: there is no such local file or directory ({os.path.abspath(name)}), the Hugging "
        f"Face cache ({constants.HF_HUB_CACHE}) does not hold it, and {why}. Fetch it once where the network "
        f"allows: `hf download {name} {' '.join(TOKENIZER_FILES)}` (into the same cache, or copy the cache)"
        f"{unset}, or pass a local vocab.txt, tokenizer.json, SentencePiece .model or model directory with -t")


PROBE_TIMEOUT = 5.0  # seconds; HF_HUB_ETAG_TIMEOUT, when set, is used instead


def _probe_hub(name: str) -> Exception | None:
    """Why the hub does not answer for ``name`` (one HEAD request, no retry), or None if it does.

    Any HTTP answer below 500 counts as an answer (a missing repository or file is reported by
    ``hf_hub_download`` afterwards); a connection error, a timeout or a server error does not.
    """
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError

    timeout = constants.HF_HUB_ETAG_TIMEOUT if os.environ.get("HF_HUB_ETAG_TIMEOUT") else PROBE_TIMEOUT
    try:
        get_hf_file_metadata(hf_hub_url(name, TOKENIZER_FILES[0]), timeout=timeout)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        return exc if status is None or status >= 500 or status == 408 else None
    except Exception as exc:  # noqa: BLE001 - the HTTP library's own errors differ between versions
        return exc
    return None


def _brief(exc: Exception) -> str:
    """``ConnectError: [Errno 111] Connection refused``: the error's name and first line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
