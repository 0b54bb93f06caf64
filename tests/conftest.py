from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    """``REPO/sample``: the bundled sample corpus."""
    return REPO / "sample"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """``REPO/tests/data``: test-only data."""
    return REPO / "tests" / "data"
