"""The checks, in the order and under the names of the release notes' "Verified" list
(shared/seeds/sm75-turing-release-notes.txt), plus torch.compile, non-contiguous inputs,
extreme magnitudes and head dims between the kernels' widths."""

from __future__ import annotations

from . import checks_masks as m
from . import checks_numeric as n
from . import checks_runtime as r
from .runner import Check

CHECKS: list[Check] = [
    Check("Native runtime", "native-runtime", r.native_runtime),
    Check("Public SageAttention API", "public-api", r.public_api, native=False),
    Check("FP16", "fp16", n.fp16, in_accuracy_summary=True),
    Check("BF16", "bf16", n.bf16, in_accuracy_summary=True),
    Check("HND and NHD tensor layouts", "layouts", n.layouts, in_accuracy_summary=True),
    Check("Causal and non-causal attention", "causal", n.causal_and_not,
          in_accuracy_summary=True),
    Check("Head dimensions 64 and 128", "head-dims", n.head_dims, in_accuracy_summary=True),
    Check("Sequence-length boundary testing", "seq-boundaries", n.sequence_boundaries),
    Check("GQA / MQA", "gqa-mqa", n.gqa_mqa, in_accuracy_summary=True),
    Check("Cross-attention", "cross-attention", n.cross_attention, in_accuracy_summary=True),
    Check("return_lse", "return-lse", n.return_lse),
    Check("Custom attention scale", "custom-scale", n.custom_scale, in_accuracy_summary=True),
    Check("CUDA graph capture", "cuda-graph", r.cuda_graph, needs_cuda=True),
    Check("PyTorch autocast FP16/BF16", "autocast", r.autocast),
    Check("Two CUDA streams", "two-streams", r.two_streams, needs_cuda=True),
    Check("Two-GPU alternating-device testing", "two-gpu", r.two_gpus, needs_cuda=True),
    Check("Long sequence N=16384", "long-sequence", n.long_sequence, in_accuracy_summary=True),
    Check("500-call FP16/BF16 stress testing", "stress", r.stress),
    Check("Boolean attention masks", "bool-masks", m.bool_masks, native=False),
    Check("Additive floating-point attention masks", "additive-masks", m.additive_masks,
          native=False),
    Check("Float32 additive masks with FP16/BF16 Q/K/V", "fp32-additive-masks",
          m.fp32_additive_masks, native=False),
    Check("Normal unmasked native path regression", "unmasked-regression",
          m.unmasked_regression, native=False),
    Check("torch.compile", "torch-compile", r.compiled),
    Check("Non-contiguous inputs", "non-contiguous", n.non_contiguous),
    Check("Extreme magnitudes", "extreme-magnitudes", n.extreme_magnitudes),
    Check("Head dimensions 40 and 96 (zero-padded)", "padded-head-dims", n.padded_head_dims,
          in_accuracy_summary=True),
]

CHECK_NAMES = [c.name for c in CHECKS]
