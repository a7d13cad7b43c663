"""python -m sageattention --explain: which backend sageattn picks per shape, from the CLI."""

from __future__ import annotations

import pytest
import torch

import sageattention
from sageattention import __main__ as diagnostics


def test_each_shape_gets_the_sentence_explain_gives(capsys):
    assert diagnostics.main(["--explain", "1x4x64x64", "--explain", "2X8x100x96", "--kv-heads", "2",
                             "--dtype", "bf16", "--causal"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line, (b, h, n, d) in zip(lines, ((1, 4, 64, 64), (2, 8, 100, 96))):
        q = torch.empty(b, h, n, d, dtype=torch.bfloat16)
        k = torch.empty(b, 2, n, d, dtype=torch.bfloat16)
        expected = sageattention.explain(q, k, k, is_causal=True)
        assert line == f"{b}x{h}x{n}x{d} (keys {b}x2x{n}x{d}) bf16 causal on cpu: {expected}"


def test_an_empty_call_and_a_refused_one_are_said_so(capsys):
    assert diagnostics.main(["--explain", "1x2x3x64", "--kv-len", "0",
                             "--explain", "1x3x3x64", "--kv-heads", "2"]) == 0
    empty, refused = capsys.readouterr().out.splitlines()
    assert "keys 1x2x0x64" in empty and "sageattn runs no backend" in empty
    assert "refused: query heads (3) must be a multiple of key/value heads (2)" in refused


@pytest.mark.parametrize("argv, message", [
    (["--explain", "4x32x4096"], "not a shape: '4x32x4096'"),
    (["--explain", "4x32xNx64"], "not a shape"),
    (["--causal"], "--causal: these options describe --explain's inputs"),
    (["--dtype", "bf16", "--kv-len", "5"], "--dtype, --kv-len: these options"),
    (["--explain", "1x1x1x64", "--json"], "takes no --json"),
    (["--explain", "1x1x1x64", "--kv-len", "-1"], "--kv-len must be >= 0, got -1"),
    (["--explain", "1x1x1x64", "--kv-heads", "0"], "--kv-heads must be >= 1, got 0"),
])
def test_bad_arguments_are_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        diagnostics.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
