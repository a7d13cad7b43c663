"""Checks of how the library behaves at run time: loading, dispatch, graphs, streams, devices,
autocast, torch.compile, long runs."""

from __future__ import annotations

import torch

from .api import PUBLIC_FUNCTIONS
from .lanes import DRIFT_TOLERANCE, alternate, two_devices
from .runner import Context, Recorder, Skip
from .tensors import make_qkv, reference

F16, BF16 = torch.float16, torch.bfloat16

# The public function that calls a family op directly, with the family's own first options.
_OP_FUNCTIONS = {"qk_int8_pv_fp16": "sageattn_qk_int8_pv_fp16_cuda",
                 "qk_int8_pv_fp8": "sageattn_qk_int8_pv_fp8_cuda"}


def _native(ctx: Context, backend: str):
    return next(b for b in ctx.expectation.backends if b.name == backend)


def native_runtime(ctx: Context, rec: Recorder, backend):
    native = _native(ctx, backend)
    why = ctx.api.available_families().get(native.family, "not reported by available_families()")
    if not rec.require(why is None, f"family {native.family} did not load: {why}"):
        return
    if native.via == "ptx":
        rec.note(f"{native.family} ran from {native.ptx_arch} PTX compiled by the driver's JIT")
    p = ctx.profile
    q, k, v = make_qkv(p.batch, p.heads, p.seq_len, 128, dtype=F16, device=ctx.device, seed=1)
    out, ran = ctx.call(rec, backend, q, k, v, tensor_layout="HND", is_causal=False)
    rec.compare("fp16 HND", out, reference(q, k, v), ran=ran)


def public_api(ctx: Context, rec: Recorder, backend):
    mod = ctx.api.module
    missing = [f for f in PUBLIC_FUNCTIONS if not callable(getattr(mod, f, None))]
    rec.require(not missing, f"public functions missing: {', '.join(missing)}")
    rec.require(isinstance(getattr(mod, "__version__", None), str), "__version__ is missing")
    p = ctx.profile
    q, k, v = make_qkv(p.batch, p.heads, p.seq_len, 128, dtype=F16, device=ctx.device, seed=2)
    ref = reference(q, k, v)
    if ctx.expectation.execution == "native":
        ctx.default_dispatch(rec, "sageattn() default dispatch", ref, q, k, v, tensor_layout="HND",
                             is_causal=False)
    else:
        rec.note("PTX-JIT run: the dispatcher does not pick a family for a GPU it was not built "
                 "for, so each native backend is forced")
    table = ctx.api.families_table().get("families", {})
    for native in ctx.expectation.backends:
        spec = table.get(native.family, {})
        for op in spec.get("ops", []):
            fname = _OP_FUNCTIONS.get(op)
            fn = getattr(mod, fname, None) if fname else None
            if fn is None:
                rec.fail(f"no public function for op {op} of family {native.family}")
                continue
            kwargs = {"tensor_layout": "HND", "is_causal": False}
            if spec.get("qk_quant_gran"):
                kwargs["qk_quant_gran"] = spec["qk_quant_gran"][0]
            if spec.get("pv_accum_dtype"):
                kwargs["pv_accum_dtype"] = spec["pv_accum_dtype"][0]
            out, ran = ctx.api.call(fn, native.name, q, k, v, **kwargs)
            rec.saw(ran)
            rec.require(ran == native.name, f"{fname}() ran {ran}, expected {native.name}")
            rec.compare(f"{fname}({', '.join(f'{a}={b!r}' for a, b in kwargs.items())})", out,
                        ref, ran=ran)


def cuda_graph(ctx: Context, rec: Recorder, backend):
    p = ctx.profile
    static = make_qkv(p.batch, p.heads, p.seq_len, 128, dtype=F16, device=ctx.device, seed=3)
    side = torch.cuda.Stream(device=ctx.device)
    side.wait_stream(torch.cuda.current_stream(ctx.device))
    with torch.cuda.stream(side):  # warm-up outside capture: lazy init, JIT, autotuning
        for _ in range(3):
            ctx.call(rec, backend, *static, tensor_layout="HND", is_causal=True)
    torch.cuda.current_stream(ctx.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, ran = ctx.call(rec, backend, *static, tensor_layout="HND", is_causal=True)
    for seed in (4, 5):  # replay on new inputs copied into the captured buffers
        fresh = make_qkv(p.batch, p.heads, p.seq_len, 128, dtype=F16, device=ctx.device,
                         seed=seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize(ctx.device)
        rec.compare(f"replay with inputs #{seed}", static_out,
                    reference(*fresh, is_causal=True), ran=ran)


def autocast(ctx: Context, rec: Recorder, backend):
    """q, k, v produced by a Linear under autocast, and sageattn called inside the region: the
    library's own fp32 arithmetic (scales, means) must not be downcast by autocast."""
    p = ctx.profile
    gen = torch.Generator(device=ctx.device).manual_seed(6)
    x = torch.randn(p.batch * p.seq_len, 256, generator=gen, device=ctx.device)
    proj = torch.nn.Linear(256, 3 * p.heads * 128, device=ctx.device)
    for dtype in (F16, BF16):
        # inference: the kernels are forward-only, so no autograd graph (the weights need grad)
        with torch.no_grad(), torch.autocast(device_type=ctx.device.type, dtype=dtype):
            qkv = proj(x)
            rec.require(qkv.dtype == dtype, f"autocast produced {qkv.dtype}, expected {dtype}")
            qkv = qkv.view(p.batch, p.seq_len, 3, p.heads, 128)
            q, k, v = (qkv[:, :, i] for i in range(3))  # NHD views
            out, ran = ctx.call(rec, backend, q, k, v, tensor_layout="NHD", is_causal=False)
        rec.require(out.dtype == dtype, f"output dtype {out.dtype} under autocast {dtype}")
        rec.compare(f"autocast {dtype}", out, reference(q, k, v, layout="NHD"), ran=ran)


def two_streams(ctx: Context, rec: Recorder, backend):
    p = ctx.profile
    inputs = [make_qkv(p.batch, p.heads, p.seq_len, 128, dtype=F16, device=ctx.device,
                       seed=s) for s in (7, 8)]
    refs = [reference(*qkv, is_causal=True) for qkv in inputs]
    current = torch.cuda.current_stream(ctx.device)
    streams = [torch.cuda.Stream(device=ctx.device) for _ in inputs]
    outs = [[], []]
    for s in streams:
        s.wait_stream(current)
    ran = None
    for _ in range(p.stream_calls):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                q, k, v = (t.clone() for t in inputs[i])  # written on s just before the call
                out, ran = ctx.call(rec, backend, q, k, v, tensor_layout="HND", is_causal=True)
                outs[i].append(out)
    for s in streams:
        current.wait_stream(s)
    torch.cuda.synchronize(ctx.device)
    for i in range(2):
        rec.compare(f"stream {i}", outs[i][0], refs[i], ran=ran)
        # every call's output, not only the first's: NaN in a later one must fail (Python's max()
        # drops a NaN that is not its first argument, since nan > x is False)
        bad = sum(int((~torch.isfinite(o)).sum()) for o in outs[i])
        rec.require(bad == 0, f"stream {i}: {bad} non-finite values over {len(outs[i])} calls")
        spread = float(torch.stack([(o.float() - outs[i][0].float()).abs().max()
                                    for o in outs[i]]).max())  # torch's max keeps a NaN
        rec.require(spread <= DRIFT_TOLERANCE * float(outs[i][0].float().abs().max()),
                    f"stream {i}: results differ between calls by up to {spread:.3g}")


def two_gpus(ctx: Context, rec: Recorder, backend):
    count = torch.cuda.device_count()
    if count < 2:
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(count)) or "none"
        raise Skip(f"needs two GPUs; this machine has {count} ({names})")
    lanes = two_devices(2)
    for dtype in (F16, BF16):
        alternate(ctx, rec, backend, lanes, calls=ctx.profile.two_gpu_calls, dtype=dtype,
                  label=f"{dtype} cuda:0/cuda:1")


def stress(ctx: Context, rec: Recorder, backend):
    p = ctx.profile
    b, h, n, d = p.stress_shape
    cuda = ctx.device.type == "cuda"
    for dtype in (F16, BF16):
        q, k, v = make_qkv(b, h, n, d, dtype=dtype, device=ctx.device, seed=9)
        first, ran = ctx.call(rec, backend, q, k, v, tensor_layout="HND", is_causal=True)
        first = first.detach().clone()
        rec.compare(f"{dtype} first call", first, reference(q, k, v, is_causal=True), ran=ran)
        for _ in range(3):  # warm-up before measuring memory
            ctx.call(rec, backend, q, k, v, tensor_layout="HND", is_causal=True)
        ctx.sync()
        mem0 = torch.cuda.memory_allocated(ctx.device) if cuda else 0
        bad = torch.zeros((), dtype=torch.long, device=ctx.device)
        drift = torch.zeros((), device=ctx.device)
        for _ in range(p.stress_calls - 4):
            out, _ = ctx.call(rec, backend, q, k, v, tensor_layout="HND", is_causal=True)
            bad += (~torch.isfinite(out)).sum()
            drift = torch.maximum(drift, (out.float() - first.float()).abs().max())
            del out
        ctx.sync()
        grown = (torch.cuda.memory_allocated(ctx.device) - mem0) if cuda else 0
        bad_n, drift_v = int(bad), float(drift)
        rec.require(bad_n == 0, f"{dtype}: {bad_n} non-finite values over {p.stress_calls} calls")
        rec.require(drift_v <= DRIFT_TOLERANCE * float(first.float().abs().max()),
                    f"{dtype}: output drifted by up to {drift_v:.3g} from the first call")
        rec.require(grown <= 1 << 20,
                    f"{dtype}: allocated memory grew by {grown / 2**20:.1f} MiB over the run")
        rec.note(f"{dtype}: {p.stress_calls} calls {b}x{h}x{n}x{d} causal; max drift "
                 f"{drift_v:.3g}; memory growth {grown} bytes"
                 + ("" if cuda else " (not measured off CUDA)"))


def compiled(ctx: Context, rec: Recorder, backend):
    import torch._dynamo

    torch._dynamo.reset()  # a graph traced under another forced backend must not be reused
    p = ctx.profile
    sageattn = ctx.api.sageattn

    def attention(q, k, v):
        return sageattn(q, k, v, tensor_layout="HND", is_causal=True)

    fn = torch.compile(attention, backend=p.compile_backend)
    for seed in (10, 11):
        q, k, v = make_qkv(p.batch, p.heads, p.seq_len, 128, dtype=F16, device=ctx.device,
                           seed=seed)
        out, ran = ctx.api.call(fn, backend, q, k, v)
        rec.saw(ran)
        if backend is not None:
            rec.require(ran == backend, f"under torch.compile forced {backend} but {ran} ran")
        rec.compare(f"torch.compile({p.compile_backend}) inputs #{seed}", out,
                    reference(q, k, v, is_causal=True), ran=ran)
