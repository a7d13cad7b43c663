"""Runtime guard: refuse a wheel in an environment it was not built for, in words.

A wheel compiled against torch 2.12 + CUDA 13 fails under torch 2.14 with ``undefined
symbol`` at best; this guard turns that into a sentence naming the mismatch and the wheel
to install instead. Without build info (a source checkout) every check is a no-op.
"""

from __future__ import annotations

import re
import sys
import threading
from typing import Any, Mapping

from . import build_info


class IncompatibleBuildError(RuntimeError):
    """This sageattention build cannot run here (torch, CUDA or GPU mismatch)."""


_checked_devices: set[int] = set()
_lock = threading.Lock()


def _torch_facts() -> tuple[str, str | None]:
    import torch

    return torch.__version__, torch.version.cuda


def _major_minor(version: str) -> tuple[int, int]:
    return build_info._major_minor(version, "torch")  # the label's rule: 2.11.0a0+git -> (2, 11)


def _target_sms(info: Mapping[str, Any]) -> list[int]:
    """The SM numbers of the build info's ``sm_targets`` ('sm75+PTX' -> 75, 'sm90a' -> 90)."""
    from .validation.expectation import parse_target

    return [parse_target(t).sm for t in info.get("sm_targets", [])]


def _is_release(torch_version: str) -> bool:
    """A released torch (2.11.0, 2.11.1+cu130), not a pre-release, nightly or source build
    (2.11.0a0+git1234, 2.12.0.dev20260301+cu130), whose ABI is not the release's."""
    base, _, local = torch_version.partition("+")
    return re.fullmatch(r"\d+\.\d+(\.\d+)*", base.strip()) is not None and \
        not local.lower().startswith("git")


def _platform_tag(info: Mapping[str, Any]) -> str:
    """The installed wheel's platform tag (manylinux_..., from its WHEEL file), else the
    build platform recorded in the build info."""
    try:
        from importlib import metadata

        wheel = metadata.distribution("sageattention").read_text("WHEEL") or ""
        for line in wheel.splitlines():
            if line.startswith("Tag:"):
                return line.split(":", 1)[1].strip().split("-")[-1]
    except Exception:  # noqa: BLE001 - not installed as a wheel (editable, vendored)
        pass
    return str(info.get("platform", "linux_x86_64"))


def _python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def suggested_wheel(info: Mapping[str, Any], *, sms: list[int] | None = None,
                    torch_version: str | None = None, cuda: str | None = None) -> str:
    """The wheel file name that would fit: this wheel's targets (or ``sms``) for the given
    torch and CUDA, this interpreter, this platform."""
    current = build_info.LocalLabel.parse(str(info["local_label"]))
    label = build_info.LocalLabel.create(
        sms if sms is not None else current.sms,
        torch_version or f"{current.torch[0]}.{current.torch[1]}",
        cuda or f"{current.cuda[0]}.{current.cuda[1]}")
    base = str(info["version"]).split("+")[0]
    return build_info.wheel_filename(label, _python_tag(), _platform_tag(info), base)


def _build_here(sms: list[int]) -> str:
    targets = ";".join(f"sm{s}" for s in sms)
    return (f"SAGEATTENTION_SM_TARGETS='{targets}' pip install --no-build-isolation "
            "sageattention-<version>.tar.gz")


def _how_to_get(wheel: str, sms: list[int]) -> str:
    return (f"Install {wheel} instead (pick it from a release with scripts/pick_wheel.py), or "
            f"build one here: {_build_here(sms)}")


def import_problem(info: Mapping[str, Any] | None, torch_version: str,
                   torch_cuda: str | None) -> str | None:
    """Why this build cannot be imported with this torch, or None when it can."""
    if info is None:
        return None
    built_torch = _major_minor(str(info["torch"]))
    built_cuda = str(info["cuda"])
    sms = _target_sms(info)
    name = f"sageattention {info['version']}"
    try:
        running = _major_minor(str(torch_version))
        running_cuda = None if torch_cuda is None else build_info._major_minor(torch_cuda, "CUDA")
    except ValueError:  # was a ValueError or IndexError traceback at import
        return (f"{name} was built for torch {built_torch[0]}.{built_torch[1]} with CUDA "
                f"{built_cuda}, but the installed torch reports version {torch_version!r} "
                f"(torch.version.cuda {torch_cuda!r}), not 'X.Y[.Z]' and 'X.Y': this guard cannot "
                f"tell whether its compiled kernels load here. Install torch=="
                f"{built_torch[0]}.{built_torch[1]}.* built for CUDA {built_cuda} (for example "
                f"from https://download.pytorch.org/whl/cu{built_cuda.replace('.', '')}).")
    if torch_cuda is None:  # torch.version.cuda is None for a CPU and for a ROCm build
        kind = build_info.torch_without_cuda(torch_version)
        return (f"{name} was built for torch {built_torch[0]}.{built_torch[1]} with CUDA "
                f"{built_cuda}, but the installed torch {torch_version} is {kind}. "
                f"Install a CUDA {built_cuda} build of torch=={built_torch[0]}.{built_torch[1]}.*"
                f" (for example from https://download.pytorch.org/whl/cu"
                f"{built_cuda.replace('.', '')}).")
    problems = []
    if running != built_torch:
        problems.append(f"torch {built_torch[0]}.{built_torch[1]} (installed: {torch_version})")
    if running_cuda[0] != build_info._major_minor(built_cuda, "CUDA")[0]:
        problems.append(f"CUDA {built_cuda} (installed torch uses CUDA {torch_cuda})")
    if not problems:
        return None
    wheel = suggested_wheel(info, torch_version=torch_version, cuda=torch_cuda)
    return (f"{name} was built for {' and '.join(problems)}; its compiled kernels cannot load "
            f"here. {_how_to_get(wheel, sms)}")


def import_caveat(info: Mapping[str, Any] | None, torch_version: str) -> str | None:
    """A note, not a mismatch: the installed torch has the build's major.minor but is a
    pre-release, nightly or source build (2.11.0a0+git1234, as in NVIDIA's containers), whose
    ABI may differ from the release the wheel was built against. None when there is nothing to
    say (a release, or a source checkout)."""
    if info is None or _is_release(str(torch_version)) or not _is_release(str(info["torch"])):
        return None
    built = str(info["torch"]).split("+")[0]
    return (f"torch {torch_version} is a pre-release or source build of torch "
            f"{'.'.join(map(str, _major_minor(built)))}; sageattention {info['version']} was "
            f"built against the release torch {info['torch']}, so its compiled kernels may fail "
            f"to load (undefined symbol). sageattn then uses the other backends (Triton, PyTorch "
            f"SDPA); for the native kernels install torch=={built} or build sageattention "
            f"against this torch: {_build_here(_target_sms(info))}")


def load_failure(info: Mapping[str, Any] | None, torch_version: str, torch_cuda: str | None,
                 extension: str, error: BaseException) -> str:
    """What to say when ``extension`` is in this installation but cannot be loaded (an OSError
    or ImportError such as ``undefined symbol: ...``): the wheel's torch, the running torch,
    and what to install."""
    running = f"torch {torch_version} (CUDA {torch_cuda})"
    what = f"{extension} could not be loaded ({type(error).__name__}: {error})"
    if info is None:
        return (f"{what}: it was compiled in place against another torch or CUDA than the "
                f"running {running}. Rebuild it against this torch: pip install "
                "--no-build-isolation .")
    built = f"torch {info['torch']} (CUDA {info['cuda']})"
    head = (f"{what}: sageattention {info['version']} was built against {built}, the running "
            f"torch is {torch_version} (CUDA {torch_cuda}).")
    problem = import_problem(info, torch_version, torch_cuda)
    if problem is not None:
        return f"{head} {problem}"
    release = str(info["torch"]).split("+")[0]
    if str(torch_version).split("+")[0] == release:
        return (f"{head} That is the same torch, so a library the extension needs is missing or "
                "another version of it was loaded first (LD_LIBRARY_PATH, a second CUDA runtime "
                "imported before torch): check that torch's CUDA libraries (the nvidia-* "
                "packages) are installed, then reinstall the wheel: pip install "
                "--force-reinstall --no-deps <the sageattention .whl file you installed>. Until "
                "then sageattn uses the other backends (Triton, PyTorch SDPA).")
    return (f"{head} Its compiled code needs that torch build: install torch=={release} for "
            f"CUDA {info['cuda']}, or build sageattention against this torch: "
            f"{_build_here(_target_sms(info))}. Until then sageattn uses the other backends "
            f"(Triton, PyTorch SDPA).")


def served_by(info: Mapping[str, Any], capability: tuple[int, int]) -> str | None:
    """How this build runs on a GPU of ``capability``: 'sm80 SASS', 'compute_75 PTX (JIT)',
    or None when it cannot. SASS runs on the same major and an equal or higher minor; PTX
    (JIT-compiled by the driver) where the dispatcher runs it, expectation.ptx_serves's rule: a
    family's embed_ptx on every equal or newer GPU, a '+PTX' target's only on the SMs its
    families serve (compute_89 PTX runs on an sm90 GPU, not on an sm120 one)."""
    major, minor = capability
    device = major * 10 + minor
    for sm in _target_sms(info):
        if sm // 10 == major and sm % 10 <= minor:
            return f"sm{sm} SASS"
    from .backends import load_families
    from .validation.expectation import ptx_runs_on, wheel_ptx_serves

    wheel_families = info.get("families")
    # Build info without its families (written before they were recorded): PTX reaches every
    # newer GPU, as the driver would run it.
    families = load_families() if wheel_families else None
    # newest first, by number (as text, compute_75 sorted before compute_100)
    for ptx in sorted(info.get("ptx") or [], key=lambda name: int(name.split("_")[1]), reverse=True):
        ptx_sm = int(ptx.split("_")[1])
        reach = None if families is None else wheel_ptx_serves(families, wheel_families, ptx_sm)
        if ptx_runs_on(reach, ptx_sm, device):
            return f"{ptx} PTX (JIT-compiled by the driver)"
    return None


def device_problem(info: Mapping[str, Any] | None, capability: tuple[int, int],
                   device_name: str = "this GPU") -> str | None:
    if info is None or served_by(info, capability) is not None:
        return None
    sm = capability[0] * 10 + capability[1]
    targets = ", ".join(info.get("sm_targets", [])) or "none"
    ptx = ", ".join(info.get("ptx") or []) or "none"
    head = (f"sageattention {info['version']} has kernels for {targets} (embedded PTX: {ptx}),"
            f" which cannot run on {device_name} (sm{sm}).")
    sms = _targets_that_run_on(sm)
    if sms is None:  # older than every family: it named a wheel (sm61) that cannot exist
        return (f"{head} No sageattention kernel family runs on sm{sm}: the oldest GPU they "
                f"serve is sm{_oldest_served()}, so no wheel has native kernels for it. Use "
                "sageattn, which runs PyTorch SDPA there (and the Triton kernels where they "
                "run), instead of a native kernel function or a forced native backend.")
    wheel = suggested_wheel(info, sms=sms)
    via = "" if sms == [sm] else (f" No kernel family is built for sm{sm}; the sm{sms[0]} "
                                  f"family's embedded PTX runs there.")
    return f"{head}{via} {_how_to_get(wheel, sms)}"


def _oldest_served() -> int:
    from .backends import load_families

    return min(int(s[2:]) for spec in load_families().values() for s in spec.get("serves", []))


def _targets_that_run_on(sm: int) -> list[int] | None:
    """The SM target a wheel for a GPU of ``sm`` is built for: ``sm`` itself where a kernel
    family serves it, else the newest family whose embed_ptx runs there (an sm120 GPU: sm75,
    whose compute_75 PTX the driver compiles), else None (a GPU older than every family)."""
    from .backends import load_families

    from .validation.expectation import newest_embedded_ptx

    families = load_families()
    if any(f"sm{sm}" in spec.get("serves", []) for spec in families.values()):
        return [sm]
    ptx = newest_embedded_ptx((int(spec["embed_ptx"].split("_")[1]) for spec in families.values()
                               if spec.get("embed_ptx")), sm)
    return None if ptx is None else [ptx]


def _running_diagnostics() -> bool:
    # `python -m sageattention` imports the package first; it must still be able to print
    # the verdict, so the import check only records the problem there.
    argv = getattr(sys, "orig_argv", [])
    for i, arg in enumerate(argv):
        if arg == "-m" and argv[i + 1:i + 2] == ["sageattention"]:
            return True
        if arg == "-msageattention":
            return True
    return False


def check_import() -> None:
    """Called when the package is imported. Raises IncompatibleBuildError on a torch/CUDA
    mismatch; no-op in a source checkout."""
    info = build_info.load()
    if info is None:
        return
    problem = import_problem(info, *_torch_facts())
    if problem and not _running_diagnostics():
        raise IncompatibleBuildError(problem)


def check_device(device: Any) -> None:
    """Called before the first native call on ``device``; raises IncompatibleBuildError when
    this build's SM targets (and embedded PTX) cannot serve that GPU."""
    info = build_info.load()
    if info is None:
        return
    import torch

    index = torch.device(device).index
    if index is None:
        index = torch.cuda.current_device()
    if index in _checked_devices:
        return
    capability = torch.cuda.get_device_capability(index)
    problem = device_problem(info, capability, f"{torch.cuda.get_device_name(index)} "
                                               f"(cuda:{index})")
    if problem:
        raise IncompatibleBuildError(problem)
    with _lock:
        _checked_devices.add(index)
