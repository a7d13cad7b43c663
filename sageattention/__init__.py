"""sageattention: quantized attention (SageAttention 2) for PyTorch, with per-GPU native kernels,
Triton kernels and an exact PyTorch SDPA fallback.

Importing needs no compiled extension and no GPU; kernels load on first use.
"""

from __future__ import annotations


def _package_version() -> str:
    try:
        from . import build_info
        package_version = build_info.package_version
    except (ImportError, AttributeError):  # the factory's module is not there yet (early checkout)
        from ._version import BASE_VERSION
        return BASE_VERSION
    return package_version()  # a damaged wheel's build info raises DamagedInstallError here


def _check_import() -> None:
    """A wheel checks on import that it matches the installed torch/CUDA (raises a clear error)."""
    try:
        from . import guard
    except ImportError:
        return
    check = getattr(guard, "check_import", None)
    if check is not None:
        check()


def _torch_missing_for_diagnostics() -> bool:
    """Whether torch cannot be imported while `python -m sageattention` runs: that command's verdict
    says so ("torch is not importable"); the package's import would end in a traceback first."""
    try:
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or an OSError from a CUDA library
        from . import guard
        if guard._running_diagnostics():
            return True
        raise
    return False


__version__ = _package_version()
if not _torch_missing_for_diagnostics():
    _check_import()

    from .core import (  # noqa: E402  (after the import-time guard)
        sageattn,
        sageattn_qk_int8_pv_fp8_cuda,
        sageattn_qk_int8_pv_fp8_cuda_sm90,
        sageattn_qk_int8_pv_fp16_cuda,
        sageattn_qk_int8_pv_fp16_triton,
        sageattn_varlen,
    )
    from .dispatch import (  # noqa: E402
        BackendChoice,
        BackendUnavailableError,
        explain,
        force_backend,
        last_backend,
        select_backend,
        use_calibration,
    )
    from .sdpa_compat import patch_sdpa, scaled_dot_product_attention  # noqa: E402

__all__ = [
    "BackendChoice",
    "BackendUnavailableError",
    "__version__",
    "explain",
    "force_backend",
    "last_backend",
    "patch_sdpa",
    "sageattn",
    "sageattn_qk_int8_pv_fp16_cuda",
    "sageattn_qk_int8_pv_fp16_triton",
    "sageattn_qk_int8_pv_fp8_cuda",
    "sageattn_qk_int8_pv_fp8_cuda_sm90",
    "sageattn_varlen",
    "scaled_dot_product_attention",
    "select_backend",
    "use_calibration",
]
