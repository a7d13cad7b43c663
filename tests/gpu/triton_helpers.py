"""Shared by the GPU tests of the Triton backend (a helper module, not a test file)."""
from __future__ import annotations

import pytest


def triton_or_skip():
    """The sageattention.triton module, or the test skipped with the reason it cannot run here."""
    st = pytest.importorskip("sageattention.triton")
    ok, reason = st.is_available()
    if not ok:
        pytest.skip(f"Triton backend unavailable here: {reason}")
    return st
