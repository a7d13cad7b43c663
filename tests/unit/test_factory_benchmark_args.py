"""python -m sageattention.benchmark's argument parsing: grid values no kernel can take, and
outputs that cannot be written, are refused before any GPU work (exit status 2)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sageattention import backends, benchmark  # noqa: E402


def _parse_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        benchmark.build_parser().parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_accepted_head_dims_are_the_capability_tables():
    """Not a second list: the union of every quantized backend's head dims in backends.py."""
    table = set()
    for row in backends.capability_table():
        if row.kind != "sdpa":
            table |= set(row.head_dims)
    assert set(benchmark.quantized_head_dims()) == table
    # a Turing GPU runs the sm75 family alone (Triton needs 8.0+): every head dim up to its widest
    # kernel's, the narrower ones zero-padded
    native = set(range(1, max(backends.load_families()["sm75"]["head_dims"]) + 1))
    assert set(benchmark.quantized_head_dims((7, 5))) == native
    assert benchmark.quantized_head_dims((6, 1)) == []


@pytest.mark.parametrize("bad", ["0", "-64", "257", "300", "abc", "64.0"])
def test_a_head_dim_no_quantized_kernel_takes_is_refused_with_the_accepted_ones(bad, capsys):
    """--head-dim 300 used to run: sageattn fell back to SDPA, every forced backend failed, and
    the run timed SDPA against SDPA and exited 0."""
    err = _parse_error(["--head-dim", "64", bad], capsys)
    accepted = benchmark.spans(benchmark.quantized_head_dims())
    assert f"argument --head-dim: {bad!r} is not a head dim the quantized kernels take; " \
           f"they take {accepted}" in err


def test_head_dims_the_kernels_take_are_accepted():
    dims = benchmark.quantized_head_dims()
    args = benchmark.build_parser().parse_args(["--head-dim", str(dims[0]), "64", "128",
                                                "--head-dim", str(dims[-1])])
    assert args.head_dim == [dims[0], 64, 128, dims[-1]]


def test_help_lists_the_accepted_head_dims(capsys):
    with pytest.raises(SystemExit):
        benchmark.build_parser().parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"quantized kernels take: {benchmark.spans(benchmark.quantized_head_dims())}" in out


def test_spans_writes_runs_as_ranges():
    assert benchmark.spans([1, 2, 3, 64, 128, 129]) == "1..3, 64, 128..129"
    assert benchmark.spans([]) == ""


def test_an_output_in_a_folder_that_cannot_be_written_is_refused(tmp_path, monkeypatch, capsys):
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if Path(p) == tmp_path
                        and mode & os.W_OK else real(p, mode, *a, **k))
    err = _parse_error(["--json", str(tmp_path / "bench.json")], capsys)
    assert f"cannot write in {tmp_path}" in err
    err = _parse_error(["--render", "x.json", "--markdown", str(tmp_path / "sub" / "t.md")], capsys)
    assert f"cannot write in {tmp_path}" in err


def test_a_head_dim_no_kernel_takes_on_this_gpu_is_refused_before_timing(monkeypatch, capsys):
    """On a Turing GPU only the sm75 family runs (Triton needs 8.0+): --head-dim 160 there would
    time SDPA against SDPA; it is refused once the GPU is known, before anything is measured."""
    import torch

    from sageattention import dispatch

    monkeypatch.setattr(dispatch, "environment_problems", lambda *a, **k: [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(benchmark, "run", lambda *a, **k: pytest.fail("measured before refusing"))
    assert benchmark.main(["--head-dim", "64", "160", "--dtype", "fp16"]) == 2
    err = capsys.readouterr().err
    native = benchmark.spans(benchmark.quantized_head_dims((7, 5)))
    assert (f"--head-dim 160: no quantized kernel takes it on this GPU (compute capability 7.5); "
            f"here they take {native}") in err
