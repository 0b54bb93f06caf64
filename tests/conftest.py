"""Shared fixtures: paths to the bundled real data and a loaded tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

# real servers for the executor and storage tests (SeaweedFS, moto, a Ray cluster): see that module
pytest_plugins = ["conftest_servers"]

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample"
DATA = REPO / "tests" / "data"
VOCAB = SAMPLE / "bert-base-uncased-vocab.txt"
SAMPLE_TEXT = SAMPLE / "sample_text.txt"
WIKITEXT = SAMPLE / "wikitext2-train-1MB.txt"
WIKIEXTRACTOR = SAMPLE / "wikiextractor-AA.txt"
GOLDEN = DATA / "golden"
ROBERTA_BPE_GZ = DATA / "roberta-gpt2-tokenizer.json.gz"  # a RoBERTa-style byte-level BPE (see data/README.md)


@pytest.fixture(scope="session")
def tok():
    from mlm_pipeline.tokenize import load_tokenizer

    return load_tokenizer(str(VOCAB), True)


@pytest.fixture(scope="session")
def roberta_bpe(tmp_path_factory) -> Path:
    """The RoBERTa-style byte-level BPE ``tokenizer.json`` (GPT-2's merges), unpacked."""
    import gzip

    path = tmp_path_factory.mktemp("roberta") / "tokenizer.json"
    path.write_bytes(gzip.decompress(ROBERTA_BPE_GZ.read_bytes()))
    return path


def bert_text_documents(path: Path, limit: int | None = None) -> list[list[str]]:
    """Documents of a Google-format text file (blank line = boundary), parsed plainly for tests."""
    docs: list[list[str]] = [[]]
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                if docs[-1]:
                    docs.append([])
            else:
                docs[-1].append(line)
            if limit and len(docs) > limit:
                break
    return [d for d in docs if d][:limit]


@pytest.fixture(scope="session")
def wikitext_docs(tok):
    from mlm_pipeline.stats import ReadStats
    from mlm_pipeline.task import tokenize_documents

    return tokenize_documents(bert_text_documents(WIKITEXT), tok, ReadStats())


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    return SAMPLE


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA
