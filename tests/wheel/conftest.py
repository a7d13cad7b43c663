"""The wheel tier: checks one built wheel, given by --wheel FILE or $SAGEATTENTION_TEST_WHEEL.

    python -m pytest tests/wheel -q --wheel wheelhouse/sageattention-...whl
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_addoption(parser):
    parser.addoption("--wheel", default=os.environ.get("SAGEATTENTION_TEST_WHEEL"),
                     help="the built wheel to check (default: $SAGEATTENTION_TEST_WHEEL)")


@pytest.fixture(scope="session")
def wheel(request) -> Path:
    value = request.config.getoption("--wheel")
    if not value:
        pytest.skip("no wheel given: pass --wheel FILE or set SAGEATTENTION_TEST_WHEEL")
    path = Path(value)
    if not path.is_file():
        pytest.fail(f"--wheel {path}: no such file")
    return path
