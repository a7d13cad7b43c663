"""Alternating calls between lanes (a device and a stream each), shared by the two-GPU check and
by its one-GPU stand-in (two streams on one device) in tests/gpu."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .runner import Context, Recorder
from .tensors import make_qkv, reference


# Same inputs must give the same output on every call; the kernels are deterministic, so this
# only leaves room for a different (autotuned) launch configuration after the first call.
DRIFT_TOLERANCE = 1e-3  # times max |first output|


def _current_device() -> int | None:
    return torch.cuda.current_device() if torch.cuda.is_available() else None


@dataclass
class Lane:
    device: torch.device
    stream: torch.cuda.Stream | None  # None: the device's current stream


def alternate(ctx: Context, rec: Recorder, backend: str | None, lanes: list[Lane], *,
              calls: int, dtype: torch.dtype, label: str) -> None:
    """``calls`` calls per lane, lanes interleaved. Each lane has its own inputs; every call must
    return on its lane's device, leave the caller's current device as it was, and match fp32 SDPA
    on the first call and the first call's output on every later one (no drift)."""
    b, h, n, d = ctx.profile.lane_shape
    data = []
    for i, lane in enumerate(lanes):
        q, k, v = make_qkv(b, h, n, d, dtype=dtype, device=lane.device, seed=200 + 7 * i)
        data.append({"qkv": (q, k, v), "ref": reference(q, k, v), "first": None,
                     "drift": torch.zeros((), device=lane.device),
                     "bad": torch.zeros((), dtype=torch.long, device=lane.device)})
    for lane in lanes:  # inputs were made on the device's current stream
        if lane.stream is not None:
            lane.stream.wait_stream(torch.cuda.current_stream(lane.device))
    for call in range(calls):
        for i, lane in enumerate(lanes):
            other = lanes[(i + 1) % len(lanes)].device
            # Odd calls are made with the *other* lane's device current: the library must put
            # its launches on the tensors' device (a device guard), not on the current one.
            if lane.stream is not None and call % 2 == 0:
                scope = torch.cuda.stream(lane.stream)
            elif other.type == "cuda":
                scope = torch.cuda.device(other)
            else:
                scope = contextlib.nullcontext()
            slot = data[i]
            with scope:
                before = _current_device()
                # fresh copies written on this stream right before the call, so a launch on the
                # wrong stream could read them unfinished
                q, k, v = (t.clone() for t in slot["qkv"])
                out, ran = ctx.call(rec, backend, q, k, v, tensor_layout="HND", is_causal=False)
                after = _current_device()
                if out.device != lane.device:
                    rec.fail(f"{label}: lane {i} call {call}: output on {out.device}, inputs on "
                             f"{lane.device}")
                    return
                if before != after:
                    rec.fail(f"{label}: the call changed the current device from {before} to "
                             f"{after}")
                    return
                if slot["first"] is None:
                    slot["first"] = out.detach().clone()
                    rec.compare(f"{label} lane {i} ({lane.device}) first call", out, slot["ref"],
                                ran=ran)
                else:
                    slot["bad"] += (~torch.isfinite(out)).sum()
                    slot["drift"] = torch.maximum(
                        slot["drift"], (out.float() - slot["first"].float()).abs().max())
            if lane.stream is not None:  # odd and even calls share this lane's tensors
                cur = torch.cuda.current_stream(lane.device)
                cur.wait_stream(lane.stream)
                lane.stream.wait_stream(cur)
    for lane in lanes:
        if lane.device.type == "cuda":
            torch.cuda.synchronize(lane.device)
    for i, slot in enumerate(data):
        bad, drift = int(slot["bad"]), float(slot["drift"])
        scale = float(slot["first"].float().abs().max()) if slot["first"] is not None else 0.0
        rec.require(bad == 0, f"{label}: lane {i}: {bad} non-finite values over {calls} calls")
        rec.require(drift <= DRIFT_TOLERANCE * scale,
                    f"{label}: lane {i}: outputs drifted by up to {drift:.3g} from the first "
                    f"call on the same inputs")
        rec.note(f"{label}: lane {i}: max drift from the first call {drift:.3g}")
    rec.note(f"{label}: {calls} calls per lane over {len(lanes)} lanes")


def two_devices(count: int) -> list[Lane]:
    return [Lane(torch.device("cuda", i), torch.cuda.Stream(device=i)) for i in range(count)]


def two_streams_one_device(device: torch.device) -> list[Lane]:
    return [Lane(device, torch.cuda.Stream(device=device)),
            Lane(device, torch.cuda.Stream(device=device))]
