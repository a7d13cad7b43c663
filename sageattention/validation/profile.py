"""Sizes the checks run at. ``FULL`` is the release run; ``QUICK`` trims the performance section
and the repeat counts; the unit tests use a tiny one on the CPU."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    batch: int = 2
    heads: int = 8
    seq_len: int = 1024
    head_dims: tuple[int, ...] = (64, 128)
    # between the native kernels' widths: they run zero-padded to 64 and to 128
    padded_head_dims: tuple[int, ...] = (40, 96)
    boundary_lengths: tuple[int, ...] = (1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129,
                                         255, 257, 1000, 1023, 1025)
    cross_lengths: tuple[int, int] = (333, 1100)
    long_seq_len: int = 16384
    long_heads: int = 8
    stress_calls: int = 500
    stress_shape: tuple[int, int, int, int] = (1, 8, 1024, 128)
    two_gpu_calls: int = 200
    lane_shape: tuple[int, int, int, int] = (1, 8, 512, 128)
    stream_calls: int = 20
    compile_backend: str = "inductor"
    lse_tolerance: float = 0.05  # max |lse - lse_ref| (natural log)
    perf_quick: bool = False
    # interleaved timing rounds per case, median kept: with one, the first timing of a shape
    # ran up to 17% slow (H100, 2026-12-05: 0.84x for a kernel whose forced timing was 0.98x)
    perf_rounds: int = 3


FULL = Profile()
# Quick keeps every check (and the 500 stress calls); it trims boundary lengths and stream
# repeats, traces torch.compile with aot_eager (fake tensors and AOTAutograd, no Inductor
# code generation, which costs tens of seconds per backend) and times fp16 cases only.
QUICK = Profile(stress_calls=500, two_gpu_calls=200, stream_calls=10, perf_quick=True,
                boundary_lengths=(1, 17, 31, 33, 63, 65, 127, 129, 1025),
                compile_backend="aot_eager")
