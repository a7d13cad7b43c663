"""GPU driver for the Triton backend: accuracy figures, tile sweep and speed, in one process.

    python benchmarks/gpu_dev_triton.py --out $OUT            # accuracy + speed on design.md's cases
    python benchmarks/gpu_dev_triton.py --sweep --out $OUT    # also try tile configs per head dim

Accuracy: against fp32 SDPA (design.md bars: cosine >= 0.9998, relative L1 <= 0.02, no NaN/Inf)
on the 20 benchmark shapes, on masks (random bool, padding, block-sparse bool, fp32 additive with
fp16/bf16 inputs, same-dtype additive with -inf) and on ragged varlen batches (1..5000 tokens)
against per-sequence SDPA; and against sageattention.reference under the same quantization.
Speed: end to end (quantization included), median of triton.testing.do_bench, SDPA's default
backend timed on the same inputs in the same process; TOPS = 4*b*h*n*n*d / time, halved for causal.
Kernels are compiled first in parallel worker processes (Triton's disk cache is shared), so the
timed process does not spend the lease compiling serially. Writes JSON and a log under --out and
prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sageattention.benchmark import UPSTREAM_106_TRITON_TOPS  # noqa: E402  (design.md's figures)
UPSTREAM_106_GEOMEAN_VS_SDPA = 0.63
SHAPES = ((4, 32, 4096, 128), (1, 32, 16384, 128), (4, 32, 4096, 64), (1, 32, 16384, 64), (8, 32, 1024, 128))
COS_MIN, REL_L1_MAX = 0.9998, 0.02
VARLEN_LENS = [1, 5000, 17, 128, 129, 2047, 64, 3333, 4096, 777]  # ragged: 1 to 5000 tokens
# Candidate tiles (block_m, block_n, num_warps, num_stages[, use_tma]) per padded head dim for
# --sweep; use_tma: K and V through tensor descriptors (Hopper's bulk tensor copy engine), the
# 2026-12-03 winner. (Triton's warp-specialized K loop was tried at e3ad302: it failed to compile
# with 4 warps on Triton 3.6 and ran slower with 8, so that knob is gone.)
SWEEP = {
    64: [(128, 64, 4, 3), (128, 64, 4, 3, True), (128, 64, 4, 4, True), (128, 64, 4, 2, True),
         (64, 64, 4, 3, True)],
    128: [(128, 64, 8, 3), (128, 64, 4, 3, True), (128, 64, 4, 4, True), (128, 64, 4, 2, True),
          (64, 64, 4, 3, True)],
}


def _log(msg: str, fh=None) -> None:
    print(msg, flush=True)
    if fh:
        fh.write(msg + "\n")
        fh.flush()


def _inputs(b, h, n, d, dtype, seed=0):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, n, d, device="cuda", generator=g).to(dtype)
    k = torch.randn(b, h, n, d, device="cuda", generator=g).to(dtype)
    v = torch.randn(b, h, n, d, device="cuda", generator=g).to(dtype)
    return q, k, v


def _metrics(out, ref):
    import torch
    out, ref = out.float(), ref.float()
    return {
        "cos": torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0).item(),
        "rel_l1": ((out - ref).abs().sum() / ref.abs().sum()).item(),
        "finite": bool(torch.isfinite(out).all()),
    }


def _passes(m) -> bool:
    return m["finite"] and m["cos"] >= COS_MIN and m["rel_l1"] <= REL_L1_MAX


def make_masks(b, h, n, dtype, seed=2):
    """The mask cases of the accuracy table, SDPA-broadcastable to [b, h, n, n]."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    lengths = torch.tensor([n, n // 3] * b, device="cuda")[:b]
    blocky = torch.rand(b, 1, n, n, device="cuda", generator=g) > 0.3
    blocky[:, :, :, n // 4:3 * n // 4] = False  # whole tiles masked for every query: skipped
    additive = torch.randn(n, n, device="cuda", generator=g)
    return {
        "bool random [B,H,N,N]": torch.rand(b, h, n, n, device="cuda", generator=g) > 0.5,
        "bool padding [B,1,1,N]": torch.arange(n, device="cuda")[None, None, None, :]
        < lengths[:, None, None, None],
        "bool block-sparse [B,1,N,N]": blocky,
        "fp32 additive [N,N]": additive,
        "same-dtype additive with -inf [N,N]": torch.where(additive > -1, 0.0, -math.inf).to(dtype),
    }


def _sdpa32(q, k, v, mask=None, **kw):
    import torch
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.float()
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                            attn_mask=mask, **kw)


# --------------------------------------------------------------------------- compile warm-up

def _warm_job(job):
    """Compiles one variant; a variant that cannot compile is reported, not fatal (the sweep
    then times what does compile and logs the error of what does not)."""
    try:
        return _compile_variant(job)
    except Exception as exc:  # noqa: BLE001 - e.g. a knob this Triton does not support
        return job, f"failed: {type(exc).__name__}: {str(exc)[:200]}"


def _compile_variant(job):
    """Runs one kernel variant on a small input so that its compiled binary lands in the cache."""
    import torch
    from sageattention.triton import attn, varlen
    kind, dtype_name, d, causal, cfg, extra = job
    dtype = getattr(torch, dtype_name)
    config = attn.KernelConfig(*cfg) if cfg else None
    t0 = time.time()
    if kind == "dense":
        q, k, v = _inputs(1, 2, 320, d, dtype)
        attn.run_attention(q, k, v, is_causal=causal, attn_mask=None, sm_scale=d ** -0.5, smooth_k=True,
                           return_lse=extra == "lse", config=config)
    elif kind == "masks":  # the accuracy table's masks, same strides, fewer heads
        q, k, v = _inputs(2, 2, 2048, d, dtype)
        for mask in make_masks(2, 2, 2048, dtype).values():
            attn.run_attention(q, k, v, is_causal=False, attn_mask=mask, sm_scale=d ** -0.5,
                               smooth_k=True, return_lse=False)
    else:
        cu = torch.tensor([0, 100, 350], dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn(350, 4, d, device="cuda").to(dtype) for _ in range(3))
        varlen.run_varlen(q, k, v, cu, cu, 250, 250, is_causal=causal, sm_scale=d ** -0.5, smooth_k=True)
    torch.cuda.synchronize()
    return job, time.time() - t0


def warm_up(jobs, workers: int, fh) -> None:
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        for job, seconds in pool.imap_unordered(_warm_job, jobs):
            if isinstance(seconds, str):
                _log(f"  warm-up {job}: {seconds}", fh)
    _log(f"warm-up: {len(jobs)} kernel variants compiled by {workers} workers in {time.time() - t0:.1f} s", fh)


# --------------------------------------------------------------------------- accuracy

def accuracy(fh) -> list[dict]:
    import torch
    import sageattention.triton as st
    from sageattention.reference import sageattn_reference
    rows = []

    def add(name, m, extra=None):
        row = {"case": name, **m, "pass": _passes(m), **(extra or {})}
        rows.append(row)
        _log(f"  {name:58s} cos={m['cos']:.6f} relL1={m['rel_l1']:.5f} finite={m['finite']} "
             f"{'PASS' if row['pass'] else 'FAIL'}", fh)

    _log("accuracy vs fp32 SDPA (benchmark shapes, normal inputs)", fh)
    for dtype in (torch.float16, torch.bfloat16):
        for (b, h, n, d) in SHAPES:
            q, k, v = _inputs(b, h, n, d, dtype, seed=n + d)
            for causal in (False, True):
                out, _ = st.attention(q, k, v, tensor_layout="HND", is_causal=causal)
                add(f"{str(dtype)[6:]} {b}x{h}x{n}x{d} {'causal' if causal else 'full'}",
                    _metrics(out, _sdpa32(q, k, v, is_causal=causal)))
            del q, k, v

    _log("masks vs fp32 SDPA (2x8x2048x128)", fh)
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = _inputs(2, 8, 2048, 128, dtype, seed=1)
        masks = make_masks(2, 8, 2048, dtype)
        for name, mask in masks.items():
            out, _ = st.attention(q, k, v, tensor_layout="HND", attn_mask=mask)
            add(f"{str(dtype)[6:]} mask {name}", _metrics(out, _sdpa32(q, k, v, mask=mask)))
        del q, k, v, masks

    _log("varlen vs per-sequence fp32 SDPA (ragged 1..5000 tokens, GQA 16/4, d=128)", fh)
    lens = VARLEN_LENS
    for dtype in (torch.float16, torch.bfloat16):
        for causal in (False, True):
            cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
            g = torch.Generator(device="cuda").manual_seed(3)
            q = torch.randn(sum(lens), 16, 128, device="cuda", generator=g).to(dtype)
            k = torch.cat([torch.randn(n, 4, 128, device="cuda", generator=g) + (i % 3)
                           for i, n in enumerate(lens)]).to(dtype)
            v = torch.randn(sum(lens), 4, 128, device="cuda", generator=g).to(dtype)
            out = st.varlen_attention(q, k, v, cu, cu, max(lens), max(lens), is_causal=causal)
            worst = {"cos": 1.0, "rel_l1": 0.0, "finite": bool(torch.isfinite(out).all())}
            for i, n in enumerate(lens):
                if n == 1:
                    continue  # one key: the output is that value exactly (checked in tests)
                s = slice(int(cu[i]), int(cu[i + 1]))
                qi, ki, vi = (t[s].transpose(0, 1)[None] for t in (q, k, v))
                m = _metrics(out[s].transpose(0, 1)[None], _sdpa32(qi, ki, vi, is_causal=causal))
                worst["cos"] = min(worst["cos"], m["cos"])
                worst["rel_l1"] = max(worst["rel_l1"], m["rel_l1"])
            add(f"{str(dtype)[6:]} varlen {'causal' if causal else 'full'} (worst sequence)", worst)

    _log("agreement with sageattention.reference (same quantization, per_block)", fh)
    for causal in (False, True):
        q, k, v = _inputs(1, 8, 2000, 128, torch.float16, seed=4)
        k = k + 1.0
        out, lse = st.attention(q, k, v, tensor_layout="HND", is_causal=causal, return_lse=True)
        ref, ref_lse = sageattn_reference(q, k, v, is_causal=causal, qk_quant_gran="per_block",
                                          return_lse=True)
        m = _metrics(out, ref)
        m["lse_max_abs"] = (lse - ref_lse).abs().max().item()
        rows.append({"case": f"vs reference {'causal' if causal else 'full'}", **m,
                     "pass": m["rel_l1"] < 1e-3 and m["lse_max_abs"] < 1e-3})
        _log(f"  vs reference {'causal' if causal else 'full'}: cos={m['cos']:.8f} relL1={m['rel_l1']:.2e} "
             f"lse max|diff|={m['lse_max_abs']:.2e}", fh)
    return rows


# --------------------------------------------------------------------------- speed

def _bench(fn):
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def speed(fh, configs: dict | None) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from sageattention.triton import attn, quant
    rows = []
    _log("speed (TOPS, end to end; SDPA default backend on the same inputs)", fh)
    for dtype in (torch.float16, torch.bfloat16):
        for (b, h, n, d) in SHAPES:
            q, k, v = _inputs(b, h, n, d, dtype, seed=5)
            for causal in (False, True):
                flops = 4.0 * b * h * n * n * d / (2 if causal else 1)
                cfg = (configs or {}).get((d, causal))
                config = attn.KernelConfig(*cfg) if cfg else None

                def ours(q=q, k=k, v=v, causal=causal, d=d, config=config):
                    attn.run_attention(q, k, v, is_causal=causal, attn_mask=None, sm_scale=d ** -0.5,
                                       smooth_k=True, return_lse=False, config=config)

                def sdpa(q=q, k=k, v=v, causal=causal):
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                ms = _bench(ours)
                ms_sdpa = _bench(sdpa)
                key = (b, h, n, d, causal)
                row = {"dtype": str(dtype)[6:], "b": b, "h": h, "n": n, "d": d, "causal": causal,
                       "ms": ms, "tops": flops / ms / 1e9, "sdpa_ms": ms_sdpa,
                       "sdpa_tops": flops / ms_sdpa / 1e9, "speedup_vs_sdpa": ms_sdpa / ms,
                       "upstream_106_tops": UPSTREAM_106_TRITON_TOPS.get(key) if dtype == torch.float16 else None,
                       "config": list(cfg) if cfg else list(vars(attn.pick_config(d, causal, False)).values())}
                rows.append(row)
                _log(f"  {row['dtype']} {b}x{h}x{n}x{d} {'causal' if causal else 'full':6s} ours {row['tops']:6.1f} "
                     f"sdpa {row['sdpa_tops']:6.1f} x{row['speedup_vs_sdpa']:.2f} upstream {row['upstream_106_tops']}",
                     fh)
            del q, k, v
    # Quantization alone on the largest shape: its share of end-to-end time.
    q, k, v = _inputs(4, 32, 4096, 128, torch.float16)
    km = k.mean(dim=2, dtype=torch.float32)
    ms_q = _bench(lambda: quant.quantize_dense(q, block=128, pad_to=128, scale_mult=0.1))
    ms_k = _bench(lambda: quant.quantize_dense(k, block=64, pad_to=64, mean=k.mean(dim=2, dtype=torch.float32)))
    ms_m = _bench(lambda: k.mean(dim=2, dtype=torch.float32))
    del km
    _log(f"  quantization 4x32x4096x128 fp16: Q {ms_q * 1e3:.0f} us, K (with mean) {ms_k * 1e3:.0f} us "
         f"(mean alone {ms_m * 1e3:.0f} us); 128 MiB each", fh)
    rows.append({"quant_q_us": ms_q * 1e3, "quant_k_us": ms_k * 1e3, "k_mean_us": ms_m * 1e3})
    return rows


def sweep(fh) -> dict:
    import torch
    from sageattention.triton import attn
    best = {}
    _log("tile sweep (fp16, 4x32x4096; TOPS)", fh)
    for d, cands in SWEEP.items():
        q, k, v = _inputs(4, 32, 4096, d, torch.float16, seed=6)
        for causal in (False, True):
            flops = 4.0 * 4 * 32 * 4096 * 4096 * d / (2 if causal else 1)
            results = []
            for cfg in cands:
                config = attn.KernelConfig(*cfg)
                def ours(q=q, k=k, v=v, causal=causal, d=d, config=config):
                    attn.run_attention(q, k, v, is_causal=causal, attn_mask=None, sm_scale=d ** -0.5,
                                       smooth_k=True, return_lse=False, config=config)

                try:
                    ms = _bench(ours)
                except Exception as exc:  # e.g. out of shared memory for one tile shape
                    _log(f"  d={d} causal={causal} {cfg}: failed: {type(exc).__name__}: {exc}", fh)
                    continue
                results.append((flops / ms / 1e9, cfg))
                _log(f"  d={d} causal={causal} {cfg}: {flops / ms / 1e9:.1f}", fh)
            if results:
                best[(d, causal)] = max(results)[1]
        del q, k, v
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON and log")
    parser.add_argument("--sweep", action="store_true", help="try SWEEP's tile configs and time the best")
    parser.add_argument("--skip-accuracy", action="store_true", help="no accuracy table")
    parser.add_argument("--skip-speed", action="store_true", help="no speed table")
    parser.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1),
                        help="processes compiling kernels before the timed run (0: none)")
    args = parser.parse_args(argv)

    import torch
    import triton
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    fh = open(out_dir / "triton_gpu.log", "w")
    env = {"gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
           "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda}
    _log(f"environment: {env}", fh)
    t0 = time.time()

    if args.workers:
        jobs = []
        for dt in ("float16", "bfloat16"):
            for d in (64, 128):
                for causal in (False, True):
                    jobs.append(("dense", dt, d, causal, None, None))
                    if args.sweep and dt == "float16":
                        jobs += [("dense", dt, d, causal, c, None) for c in SWEEP[d]]
            if not args.skip_accuracy:
                jobs.append(("masks", dt, 128, False, None, None))
                jobs += [("varlen", dt, 128, c, None, None) for c in (False, True)]
        if not args.skip_accuracy:
            jobs += [("dense", "float16", 128, c, None, "lse") for c in (False, True)]
        warm_up(jobs, args.workers, fh)

    result = {"environment": env}
    results_path = out_dir / "triton_gpu_results.json"

    def save():  # after every section, so a run cut short still leaves its figures
        result["wall_s"] = time.time() - t0
        results_path.write_text(json.dumps(result, indent=1))

    if not args.skip_accuracy:
        result["accuracy"] = accuracy(fh)
        save()
    configs = None
    if args.sweep:
        best = sweep(fh)
        result["sweep_best"] = {f"d{d}_{'causal' if c else 'full'}": list(cfg) for (d, c), cfg in best.items()}
        configs = best
        save()
    if not args.skip_speed:
        result["speed"] = speed(fh, configs)
        save()

    # Short table last (the lease's reply shows the end of the output).
    print("\n=== summary ===")
    if "accuracy" in result:
        acc = result["accuracy"]
        failed = [r["case"] for r in acc if not r["pass"]]
        worst_cos = min(r["cos"] for r in acc)
        worst_l1 = max(r["rel_l1"] for r in acc)
        print(f"accuracy: {len(acc) - len(failed)}/{len(acc)} pass; worst cos {worst_cos:.6f}, "
              f"worst relL1 {worst_l1:.5f}; failed: {failed or 'none'}")
    if "sweep_best" in result:
        print(f"best tiles: {result['sweep_best']}")
    if "speed" in result:
        sp = [r for r in result["speed"] if "tops" in r]
        print(f"{'case':34s} {'ours':>6s} {'sdpa':>6s} {'x':>5s} {'up1.0.6':>7s}")
        for r in sp:
            name = f"{r['dtype']} {r['b']}x{r['h']}x{r['n']}x{r['d']} {'causal' if r['causal'] else 'full'}"
            print(f"{name:34s} {r['tops']:6.1f} {r['sdpa_tops']:6.1f} {r['speedup_vs_sdpa']:5.2f} "
                  f"{r['upstream_106_tops'] or '':>7}")
        geo = math.exp(sum(math.log(r["speedup_vs_sdpa"]) for r in sp) / len(sp))
        beats = [r["tops"] >= r["upstream_106_tops"] for r in sp if r["upstream_106_tops"]]
        print(f"geomean speed-up vs SDPA default: {geo:.3f} (upstream 1.0.6 Triton: "
              f"{UPSTREAM_106_GEOMEAN_VS_SDPA}); >= upstream 1.0.6 on {sum(beats)}/{len(beats)} fp16 cases")
        print(result["speed"][-1])
    print(f"wall {result['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
