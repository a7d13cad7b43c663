"""Shared fixtures only."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random state, so its tolerances hold run after run."""
    torch.manual_seed(0)


@pytest.fixture
def attn_metrics():
    """(cosine similarity, relative L1) of an output against a reference, both in float64."""

    def metrics(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
        o, r = out.double().flatten(), ref.double().flatten()
        cos = torch.nn.functional.cosine_similarity(o, r, dim=0).item()
        rel_l1 = ((o - r).abs().sum() / r.abs().sum()).item()
        return cos, rel_l1

    return metrics


@pytest.fixture
def gpu_memory():
    """Call with GiB: the test runs alone among the big-memory tests of this machine's pytest
    workers (a file lock held to its end: two of them at once would run an 80 GB card out of
    memory under pytest-xdist) and is skipped where the GPU has less free memory than that."""
    import fcntl
    import tempfile
    from pathlib import Path

    held = []

    def need(gib: int) -> None:
        lock = open(Path(tempfile.gettempdir()) / "sageattention-gpu-memory.lock", "w")
        fcntl.flock(lock, fcntl.LOCK_EX)
        held.append(lock)
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        if free < gib * 2**30:
            pytest.skip(f"needs {gib} GiB of free GPU memory, {free / 2**30:.1f} GiB free")

    yield need
    torch.cuda.empty_cache()
    for lock in held:
        lock.close()   # releases the lock
