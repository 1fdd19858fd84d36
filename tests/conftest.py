"""Shared pytest fixtures: the repository root and the test copy of TinyShakespeare."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Tests read TinyShakespeare from the shared test copy next to the checkout (never committed).
_shared_data = REPO.parent / "shared" / "data"
if "MLEXP_DATA_DIR" not in os.environ and _shared_data.is_dir():
    os.environ["MLEXP_DATA_DIR"] = str(_shared_data)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The checkout: the folder holding solutions/, lessons/ and autograder/."""
    return REPO
