"""The native (compiled) kernel families: which are in this installation, and how to call them.

Each family in ``families.json`` is one extension module, ``sageattention._kernels_<family>``,
wrapped by ``sageattention.native.<family>`` (see docs/kernels.md). A family whose extension is
missing simply is "not in this wheel": :func:`available_families` says why, and the dispatcher
chooses another backend. Nothing here imports torch or an extension until a family is asked for.
"""
from __future__ import annotations

import importlib
import json
import threading
from importlib import resources
from types import ModuleType
from typing import Any

from . import checks

__all__ = ["FAMILIES", "available_families", "family_module", "qk_int8_pv_fp16", "qk_int8_pv_fp8"]


def _read_families() -> dict[str, dict[str, Any]]:
    text = resources.files(__name__).joinpath("families.json").read_text(encoding="utf-8")
    return json.loads(text)["families"]


#: family name -> its entry in families.json ("extension", "serves", "ops", "head_dims", ...)
FAMILIES: dict[str, dict[str, Any]] = _read_families()

_lock = threading.Lock()
_status: dict[str, str | None] = {}  # family -> None (loaded) or the reason it is unusable
_modules: dict[str, ModuleType] = {}  # loaded family modules


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; known families: {sorted(FAMILIES)}")


def family_module(family: str) -> ModuleType:
    """Return ``sageattention.native.<family>`` with its extension loaded.

    Raises ValueError for an unknown family and ImportError (with the reason) when the family's
    extension is not usable in this installation.
    """
    module = _modules.get(family)  # fast path, lock-free so torch.compile can trace through it
    if module is not None:
        return module
    _check_family(family)
    reason = available_families().get(family)
    if reason is not None:
        raise ImportError(f"kernel family {family} is not available: {reason}")
    module = importlib.import_module(f"{__name__}.{family}")
    _modules[family] = module
    return module


def _load(family: str) -> str | None:
    try:
        module = importlib.import_module(f"{__name__}.{family}")
    except ImportError as exc:
        return f"the Python wrapper {__name__}.{family} could not be imported: {exc}"
    try:
        module.load()
    except ImportError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - e.g. registering the fakes; one family, not all
        return f"{__name__}.{family} failed to load ({type(exc).__name__}: {exc})"
    return None


def available_families() -> dict[str, str | None]:
    """Map each family to None when its extension is loaded, else the reason it is unusable."""
    with _lock:
        for family in FAMILIES:
            if family not in _status:
                _status[family] = _load(family)
        return dict(_status)


def _validate(family: str, op: str, qk_quant_gran: str, pv_accum_dtype: str) -> None:
    _check_family(family)
    spec = FAMILIES[family]
    if op not in spec["ops"]:
        providers = sorted(f for f, s in FAMILIES.items() if op in s["ops"])
        raise ValueError(f"kernel family {family} has no {op}; families that do: {providers}")
    if qk_quant_gran not in spec["qk_quant_gran"]:
        raise ValueError(
            f"qk_quant_gran={qk_quant_gran!r} is not supported by family {family}; "
            f"accepted: {spec['qk_quant_gran']}"
        )
    if pv_accum_dtype not in spec["pv_accum_dtype"]:
        raise ValueError(
            f"pv_accum_dtype={pv_accum_dtype!r} is not supported by family {family}; "
            f"accepted: {spec['pv_accum_dtype']}"
        )


def qk_int8_pv_fp16(q, k, v, *, family, tensor_layout, is_causal, sm_scale, qk_quant_gran,
                    pv_accum_dtype, smooth_k, smooth_v, return_lse):
    """INT8 QK^T, FP16 PV attention with a native family. Returns ``(out, lse or None)``."""
    _validate(family, "qk_int8_pv_fp16", qk_quant_gran, pv_accum_dtype)
    return family_module(family).qk_int8_pv_fp16(
        q, k, v, tensor_layout=tensor_layout, is_causal=is_causal, sm_scale=sm_scale,
        qk_quant_gran=qk_quant_gran, pv_accum_dtype=pv_accum_dtype, smooth_k=smooth_k,
        smooth_v=smooth_v, return_lse=return_lse,
    )


def qk_int8_pv_fp8(q, k, v, *, family, tensor_layout, is_causal, sm_scale, qk_quant_gran,
                   pv_accum_dtype, smooth_k, smooth_v, return_lse):
    """INT8 QK^T, FP8 (e4m3) PV attention with a native family. Returns ``(out, lse or None)``."""
    _validate(family, "qk_int8_pv_fp8", qk_quant_gran, pv_accum_dtype)
    return family_module(family).qk_int8_pv_fp8(
        q, k, v, tensor_layout=tensor_layout, is_causal=is_causal, sm_scale=sm_scale,
        qk_quant_gran=qk_quant_gran, pv_accum_dtype=pv_accum_dtype, smooth_k=smooth_k,
        smooth_v=smooth_v, return_lse=return_lse,
    )


# Shape rules shared by the families' fake (meta) implementations; they mirror
# csrc/common/torch_glue.h (quant_int8) so torch.compile and opcheck see the real shapes.

def check_4d(**tensors) -> None:
    """Refuse, as the ops do (csrc/common/op_checks.h), an input that is not 4-D. Every fake calls
    this first: while tracing, the fake runs instead of the op, and without it a 3-D input was an
    IndexError from :func:`bhnd`."""
    for name, t in tensors.items():
        if len(t.shape) != 4:
            raise checks.OpArgumentError(f"{name} must be 4-D ([B, H, N, D] for HND, [B, N, H, D] for NHD), "
                                         f"got shape {tuple(t.shape)}")


def bhnd(x, tensor_layout: str):
    """(B, H, N, D) of a 4-D tensor in the given layout."""
    if tensor_layout == "HND":
        return x.shape[0], x.shape[1], x.shape[2], x.shape[3]
    if tensor_layout == "NHD":
        return x.shape[0], x.shape[2], x.shape[1], x.shape[3]
    raise ValueError(f"tensor_layout must be 'HND' or 'NHD', got {tensor_layout!r}")


def int8_quant_shapes(n_tokens, *, is_key: bool, qk_quant_gran: str):
    """(padded tokens, scale groups per (batch, head)) of the INT8 quantization of Q or K."""
    if qk_quant_gran not in ("per_block", "per_warp", "per_thread"):
        raise ValueError(
            f"qk_quant_gran must be 'per_block', 'per_warp' or 'per_thread', got {qk_quant_gran!r}")
    pad_to = 64 if is_key else 128
    padded = (n_tokens + pad_to - 1) // pad_to * pad_to
    block = 64 if is_key else (128 if qk_quant_gran == "per_block" else 32)
    groups = 1 if qk_quant_gran != "per_thread" else (4 if is_key else 8)
    return padded, padded // block * groups


def check_quant_mean(x, mean, tensor_layout: str) -> None:
    """Refuse, before the op, a ``mean`` that ``quant_int8`` refuses (checks.check_mean: fp32
    ``[B, H, D]`` on x's device, read by the kernel through its data pointer), and one that is not
    a tensor at all. x itself is checked by the op."""
    if mean is None:
        return
    import torch

    if not isinstance(mean, torch.Tensor):
        raise TypeError(f"mean must be a torch.Tensor [B, H, D] or None, got {type(mean).__name__}")
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        return   # the op refuses x, naming what it takes
    b, h, _, d = bhnd(x, tensor_layout)
    checks.check_mean(mean, x, b, h, d)


def import_extension(extension: str, family: str) -> None:
    """Import one family's compiled extension (which registers its ops), or raise ImportError
    saying why it is not usable here: not in this wheel, missing from it, or not loadable with
    the running torch (``undefined symbol``: the wheel's torch, the running torch, what to
    install). Any failure of the import is caught, an OSError from a dependent library too:
    it was a traceback out of the dispatcher, which then counted every family unusable."""
    try:
        importlib.import_module(extension)
    except Exception as exc:  # noqa: BLE001 - whatever the loader raises, say it in words
        raise ImportError(_unusable(extension, family, exc)) from exc


def _unusable(extension: str, family: str, exc: BaseException) -> str:
    from .. import build_info, guard

    info = build_info.load()
    if not (isinstance(exc, ModuleNotFoundError) and exc.name == extension):
        return guard.load_failure(info, *guard._torch_facts(), extension, exc)
    families = None if info is None else info.get("families")
    if families is None:  # a source checkout, or build info from before families were recorded
        return (f"{extension} is not in this installation (the wheel was built without "
                f"{family}-family targets, or for another torch/CUDA): {exc}")
    if family not in families:
        return (f"{extension} is not in this installation: sageattention {info['version']} was "
                f"built without {family}-family targets (its families: "
                f"{', '.join(families) or 'none'})")
    return (f"{extension} is missing from this installation although sageattention "
            f"{info['version']} lists the {family} family: the installation is damaged. "
            "Reinstall the wheel: pip install --force-reinstall --no-deps <the sageattention "
            ".whl file you installed>")


class ExtensionLoader:
    """``load()`` of one family: import its compiled extension (which registers the ops) and
    register the ops' fake implementations, once and thread-safely; ImportError saying why the
    extension is not usable here. ``loaded`` is the lock-free fast path."""

    def __init__(self, extension: str, family: str, register_fakes) -> None:
        self.extension, self.family, self.register_fakes = extension, family, register_fakes
        self.loaded = False
        self._lock = threading.Lock()

    def __call__(self) -> None:
        if self.loaded:
            return
        with self._lock:
            if self.loaded:
                return
            import_extension(self.extension, self.family)
            self.register_fakes()
            self.loaded = True


def register_quant_int8_fake(namespace: str) -> None:
    """The fake of ``<namespace>::quant_int8``, an op every INT8 family defines with one schema."""
    import torch

    @torch.library.register_fake(f"{namespace}::quant_int8")
    def _quant_int8_fake(x, mean, tensor_layout, qk_quant_gran, is_key, scale_mult):
        check_4d(x=x)
        checks.parse_layout(tensor_layout)
        checks.parse_gran(qk_quant_gran)
        checks.check_quant_int8_args(x, mean, tensor_layout, scale_mult)
        b, h, n, d = bhnd(x, tensor_layout)
        padded, groups = int8_quant_shapes(n, is_key=is_key, qk_quant_gran=qk_quant_gran)
        return (x.new_empty((b, h, padded, d), dtype=torch.int8),
                x.new_empty((b, h, groups), dtype=torch.float32))


def attention_fake_outputs(q, tensor_layout: str, return_lse: bool):
    """What every family's attention op returns, as fakes: the output (q's shape and dtype) and the
    LSE ([B, Hq, Nq] fp32, batch 0 when not asked for)."""
    import torch

    b, h, n, _ = bhnd(q, tensor_layout)
    return q.new_empty(q.shape), q.new_empty((b if return_lse else 0, h, n), dtype=torch.float32)


def check_attention_args(family: str, q, k, v, tensor_layout, sm_scale, qk_quant_gran, pv_accum_dtype):
    """What the sm80 .. sm90_fp8 families' attention ops check, in their order (bindings.cpp):
    layout, granularity, accumulation, q/k/v, sm_scale. (The sm90a families' check of the GPU's
    compute capability is the op's alone.)"""
    checks.parse_layout(tensor_layout)
    checks.parse_gran(qk_quant_gran)
    checks.parse_accum(family, pv_accum_dtype)
    import torch

    # sm80's fp16-accumulating modes also take a float16 v beside bfloat16 q and k (pv_in_bf16)
    v_fp16 = family == "sm80" and not (q.dtype == torch.bfloat16 and pv_accum_dtype == "fp32")
    checks.check_qkv(q, k, v, tensor_layout, v_fp16_with_bf16=v_fp16)
    checks.check_finite(sm_scale, "sm_scale")


def register_qk_int8_pv_fp16_fake(namespace: str, family: str) -> None:
    """The fake of ``<namespace>::qk_int8_pv_fp16``, one schema in the sm80 and sm90 families."""
    import torch

    @torch.library.register_fake(f"{namespace}::qk_int8_pv_fp16")
    def _attn_fake(q, k, v, tensor_layout, is_causal, sm_scale, qk_quant_gran, pv_accum_dtype,
                   smooth_k, return_lse):
        check_4d(q=q, k=k, v=v)
        check_attention_args(family, q, k, v, tensor_layout, sm_scale, qk_quant_gran, pv_accum_dtype)
        return attention_fake_outputs(q, tensor_layout, return_lse)


# --- the FP8 families (sm89, sm90_fp8) -------------------------------------------------------
# Both define the same three ops with the same schemas (csrc/sm89/bindings.cpp,
# csrc/sm90_fp8/bindings.cpp), so their fakes and the argument order of their calls live here
# once; each family module passes its op namespace.

def register_fp8_family_fakes(namespace: str, family: str) -> None:
    """The fakes of ``<namespace>::quant_int8``, ``quant_v_fp8`` and ``qk_int8_pv_fp8``."""
    import torch

    register_quant_int8_fake(namespace)

    from ..reference import FP8_V_TERMS

    @torch.library.register_fake(f"{namespace}::quant_v_fp8")
    def _quant_v_fake(v, tensor_layout, smooth_v):
        check_4d(v=v)
        checks.check_quant_v_fp8_args(v, tensor_layout)
        b, h, n, d = bhnd(v, tensor_layout)
        padded = (n + 63) // 64 * 64
        return (v.new_empty((b, h, FP8_V_TERMS * d, padded), dtype=torch.float8_e4m3fn),
                v.new_empty((b, h, d), dtype=torch.float32),
                v.new_empty((b, h, d) if smooth_v else (0,), dtype=torch.float32))

    @torch.library.register_fake(f"{namespace}::qk_int8_pv_fp8")
    def _attn_fake(q, k, v, tensor_layout, is_causal, sm_scale, qk_quant_gran, pv_accum_dtype,
                   smooth_k, smooth_v, return_lse):
        check_4d(q=q, k=k, v=v)
        check_attention_args(family, q, k, v, tensor_layout, sm_scale, qk_quant_gran, pv_accum_dtype)
        return attention_fake_outputs(q, tensor_layout, return_lse)


def _namespace_ops(namespace: str):
    """``torch.ops.<namespace>``, looked up per call (so a test can define the schemas under
    another namespace)."""
    import torch

    return getattr(torch.ops, namespace)


def fp8_family_quant_int8(namespace: str, x, *, tensor_layout, qk_quant_gran, is_key,
                          scale_mult=1.0, mean=None):
    """``<namespace>::quant_int8``: (int8 [B, H, Npad, D] in HND order, fp32 scales
    [B, H, groups])."""
    check_quant_mean(x, mean, tensor_layout)
    return _namespace_ops(namespace).quant_int8(x, mean, tensor_layout, qk_quant_gran, bool(is_key),
                                                float(scale_mult))


def fp8_family_quant_v_fp8(namespace: str, v, *, tensor_layout, smooth_v):
    """``<namespace>::quant_v_fp8``: (e4m3 [B, H, FP8_V_TERMS * D, Npad], V's hi rows then its lo
    rows (``sageattention.reference.FP8_V_TERMS``), tokens permuted in 16-groups; scale [B, H, D];
    mean [B, H, D] or empty)."""
    return _namespace_ops(namespace).quant_v_fp8(v, tensor_layout, bool(smooth_v))


def fp8_family_attention(namespace: str, q, k, v, *, tensor_layout, is_causal, sm_scale,
                         qk_quant_gran, pv_accum_dtype, smooth_k, smooth_v, return_lse):
    """``<namespace>::qk_int8_pv_fp8``: ``(out, lse or None)``."""
    out, lse = _namespace_ops(namespace).qk_int8_pv_fp8(
        q, k, v, tensor_layout, bool(is_causal), float(sm_scale), qk_quant_gran, pv_accum_dtype,
        bool(smooth_k), bool(smooth_v), bool(return_lse))
    return out, (lse if return_lse else None)
