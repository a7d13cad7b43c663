"""What the run happened on: GPU, driver, torch, CUDA runtime, Python, OS, date, command."""

from __future__ import annotations

import datetime as _dt
import platform
import shlex
import shutil
import subprocess
import sys

import torch


def driver_version() -> str | None:
    """The NVIDIA driver version (e.g. "580.95.05"), from nvidia-smi; None when unavailable."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = res.stdout.strip().splitlines()
    return lines[0].strip() if res.returncode == 0 and lines else None


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return getattr(triton, "__version__", None)


def capture(device: torch.device, argv: list[str] | None = None) -> dict:
    env = {
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "triton": _triton_version(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "os": platform.system(),
        "os_release": platform.platform(),
        "machine": platform.machine(),
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "command": shlex.join([sys.executable, *(sys.argv if argv is None else argv)]),
    }
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        props = torch.cuda.get_device_properties(device)
        env.update({
            "gpu_name": torch.cuda.get_device_name(device),
            "compute_capability": f"{major}.{minor}",
            "gpu_sm": f"sm{major}{minor}",
            "gpu_count": torch.cuda.device_count(),
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
            "driver": driver_version(),
        })
    else:  # only the unit tests run the suite without a GPU
        env.update({"gpu_name": None, "compute_capability": None, "gpu_sm": None,
                    "gpu_count": 0, "driver": None})
    return env
