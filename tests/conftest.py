"""Shared fixtures: the offline data and reference folder beside the repo, tiny random configs."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared (offline data and references) is not present")
    return SHARED


@pytest.fixture(scope="session")
def protocol_dir(shared_dir) -> Path:
    path = shared_dir / "data" / "protocol"
    if not path.is_dir():
        pytest.skip("../shared/data/protocol is not present")
    return path
