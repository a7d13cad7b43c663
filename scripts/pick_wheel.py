#!/usr/bin/env python3
"""Pick the one sageattention wheel that fits this machine from a release's manifest.json.

Standard library only; torch is used when installed (for its version, its CUDA and the GPUs), and
nvidia-smi when torch cannot see a GPU. Prints the exact wheel and the pip / uv command to install
it, or, when none fits, why and the nearest options.

    python scripts/pick_wheel.py --manifest https://github.com/OWNER/REPO/releases/download/TAG/manifest.json
    python scripts/pick_wheel.py --manifest dist/release/manifest.json --env-json m.json --json

Exit codes: 0 a wheel fits; 1 no wheel fits (the reason is printed); 2 bad manifest, bad
--env-json or bad arguments.
"""

from __future__ import annotations

import argparse
import ast
import http.client
import importlib.util
import json
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

EXIT_FOUND = 0
EXIT_NONE_FITS = 1
EXIT_BAD_INPUT = 2

MANIFEST_SCHEMA_VERSION = 1

# Legacy manylinux names and the glibc they stand for (PEP 600).
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_ARCH_ALIASES = {
    "amd64": "x86_64",
    "x64": "x86_64",
    "x86_64": "x86_64",
    "arm64": "aarch64",
    "aarch64": "aarch64",
    "i386": "x86",
    "i686": "x86",
    "x86": "x86",
}
_WINDOWS_ARCH_TAG = {"x86_64": "amd64", "aarch64": "arm64", "x86": "32"}


class BadInput(Exception):
    """A manifest or machine description that cannot be used (exit code 2)."""


# ---------------------------------------------------------------- the machine


@dataclass
class Gpu:
    name: str
    cc: tuple[int, int]

    def describe(self) -> str:
        return f"{self.name} (compute capability {self.cc[0]}.{self.cc[1]})"


@dataclass
class Machine:
    os: str  # linux | windows | macos
    arch: str  # x86_64 | aarch64 | x86
    python: tuple[int, int]
    implementation: str = "cpython"
    free_threaded: bool = False  # a 3.13t-style build needs cp313t wheels
    glibc: tuple[int, int] | None = None  # None: not glibc, or unknown
    musl: tuple[int, int] | None = None  # Linux on musl (Alpine): musllinux wheels, no manylinux
    torch: str | None = None  # "2.12.0+cu130"
    torch_cuda: str | None = None  # "13.0"; None for a CPU build of torch
    gpus: list[Gpu] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def libc(self) -> str:
        """' (glibc 2.35)', ' (musl 1.2)' or '' when unknown."""
        for name, version in (("glibc", self.glibc), ("musl", self.musl)):
            if version:
                return f" ({name} {version[0]}.{version[1]})"
        return ""

    def torch_build(self) -> str:
        """'CUDA 13.0', 'ROCm build' or 'CPU-only build' (torch installed)."""
        if self.torch_cuda:
            return f"CUDA {self.torch_cuda}"
        return "ROCm build" if _torch_label_cuda(self.torch or "") == "rocm" else "CPU-only build"

    def describe(self) -> str:
        parts = [f"{self.os.capitalize()} {self.arch}{self.libc()}"]
        parts.append(
            f"{_impl_name(self)} "
            f"{self.python[0]}.{self.python[1]}{'t' if self.free_threaded else ''}"
        )
        if self.torch is None:
            parts.append("torch not installed")
        else:
            parts.append(f"torch {self.torch} ({self.torch_build()})")
        if self.gpus:
            parts += [f"GPU {i}: {g.describe()}" for i, g in enumerate(self.gpus)]
        else:
            parts.append("no NVIDIA GPU found")
        return ", ".join(parts)


def _impl_name(m: Machine) -> str:
    return "CPython" if m.implementation == "cpython" else m.implementation


def _version_pair(text: str, what: str) -> tuple[int, int]:
    match = re.match(r"^\s*(\d+)\.(\d+)", str(text))
    if not match:
        raise BadInput(f"{what}: expected a version like '3.12', got {text!r}")
    return int(match.group(1)), int(match.group(2))


def _cc_of(value: object, what: str) -> tuple[int, int]:
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    ):
        return int(value[0]), int(value[1])
    if isinstance(value, str) and re.match(r"^\s*\d+\.\d+\s*$", value):
        return _version_pair(value, what)
    raise BadInput(
        f"{what}: expected a compute capability like '8.9' or [8, 9], got {value!r}"
    )


_ENV_EXAMPLES = {
    "python": "3.12",
    "torch": "2.12.0+cu130",
    "torch_cuda": "13.0",
    "glibc": "2.35",
    "musl": "1.2",
}


def _env_version(data: dict, key: str) -> tuple[int, int]:
    """A version field of --env-json; a JSON number is refused (3.10 would read as 3.1)."""
    value = data[key]
    if not isinstance(value, str):
        raise BadInput(
            f"--env-json: {key} must be a string such as {_ENV_EXAMPLES[key]!r} "
            f"(a JSON number reads 3.10 as 3.1), got {value!r}"
        )
    if not re.match(r"^\s*\d+\.\d+", value):
        raise BadInput(f"--env-json: {key} must look like {_ENV_EXAMPLES[key]!r}, got {value!r}")
    return _version_pair(value, key)


def _torch_label_cuda(torch: str) -> str | None:
    """What torch's local version label says of its CUDA: '13.0' (+cu130), 'cpu' (+cpu), 'rocm'
    (+rocm6.2: no CUDA either), or None when the label says none of these (no label, +git...)."""
    for part in torch.partition("+")[2].lower().split("."):
        if part == "cpu":
            return "cpu"
        if part.startswith("rocm"):
            return "rocm"
        match = re.fullmatch(r"cu(\d+)(\d)", part)
        if match:
            return f"{int(match.group(1))}.{match.group(2)}"
    return None


def _norm_arch(value: str) -> str:
    arch = _ARCH_ALIASES.get(str(value).lower())
    if arch is None:
        raise BadInput(f"arch: unsupported {value!r}; expected one of {sorted(_ARCH_ALIASES)}")
    return arch


def machine_from_json(data: object) -> Machine:
    """A machine described by --env-json (see README.md, "Which wheel do I install?" for the fields)."""
    if not isinstance(data, dict):
        raise BadInput("--env-json must hold a JSON object")
    known = {
        "os",
        "arch",
        "python",
        "implementation",
        "free_threaded",
        "glibc",
        "musl",
        "torch",
        "torch_cuda",
        "gpus",
    }
    unknown = sorted(set(data) - known)
    if unknown:
        raise BadInput(f"--env-json: unknown field(s) {unknown}; accepted: {sorted(known)}")
    for key in ("os", "arch", "python"):
        if key not in data:
            raise BadInput(f"--env-json: missing {key!r} (required: os, arch, python)")
    os_name = str(data["os"]).lower()
    if os_name not in ("linux", "windows", "macos"):
        raise BadInput(f"--env-json: os {data['os']!r}; expected linux, windows or macos")
    if not isinstance(data.get("gpus") or [], list):
        raise BadInput(f"--env-json: gpus must be a list like [{{\"name\": \"Tesla T4\", "
                       f"\"compute_capability\": \"7.5\"}}], got {data['gpus']!r}")
    gpus = []
    for i, g in enumerate(data.get("gpus") or []):
        if not isinstance(g, dict) or "compute_capability" not in g:
            raise BadInput(f"--env-json: gpus[{i}] needs a compute_capability like '7.5'")
        gpus.append(
            Gpu(str(g.get("name", f"GPU {i}")), _cc_of(g["compute_capability"], f"gpus[{i}]"))
        )
    torch_cuda = data.get("torch_cuda")
    for key in ("torch", "torch_cuda", "glibc", "musl"):
        if data.get(key) is not None:
            _env_version(data, key)
    if data.get("torch"):
        # torch's own label (2.12.0+cu130, 2.12.0+cpu) and torch_cuda must tell one story.
        said = _torch_label_cuda(data["torch"])
        if "torch_cuda" not in data:
            if said is None:
                raise BadInput(
                    f"--env-json: torch_cuda is missing and torch {data['torch']!r} does not say "
                    "its CUDA; give torch.version.cuda, e.g. \"torch_cuda\": \"13.0\", or null "
                    "for a CPU build"
                )
            torch_cuda = None if said in ("cpu", "rocm") else said
        elif said is not None and (None if said in ("cpu", "rocm") else said) != (
            None if torch_cuda is None else "%d.%d" % _version_pair(torch_cuda, "torch_cuda")
        ):
            raise BadInput(
                f"--env-json: torch {data['torch']!r} and torch_cuda {torch_cuda!r} disagree; "
                "torch_cuda is torch.version.cuda (null for a CPU build)"
            )
    for key in ("glibc", "musl"):
        if data.get(key) and os_name != "linux":
            raise BadInput(f"--env-json: {key} describes a Linux machine, not os {os_name!r}")
    if data.get("glibc") and data.get("musl"):
        raise BadInput("--env-json: glibc and musl both given; a Linux machine has one C library")
    free_threaded = data.get("free_threaded", False)
    if not isinstance(free_threaded, bool):
        raise BadInput(
            f"--env-json: free_threaded must be true or false, got {free_threaded!r}"
        )
    # "3.13t" names the free-threaded build (PEP 703), which loads only cp313t wheels
    python_text = data["python"] if isinstance(data["python"], str) else ""
    if re.fullmatch(r"\s*\d+\.\d+(\.\d+)?t\s*", python_text):
        if data.get("free_threaded") is False:
            raise BadInput(
                f"--env-json: python {data['python']!r} is a free-threaded build, but "
                "free_threaded is false; write \"3.13\" or drop free_threaded"
            )
        free_threaded = True
    return Machine(
        os=os_name,
        arch=_norm_arch(data["arch"]),
        python=_env_version(data, "python"),
        implementation=str(data.get("implementation", "cpython")).lower(),
        free_threaded=free_threaded,
        glibc=_env_version(data, "glibc") if data.get("glibc") else None,
        musl=_env_version(data, "musl") if data.get("musl") else None,
        torch=str(data["torch"]) if data.get("torch") else None,
        torch_cuda=".".join(map(str, _version_pair(torch_cuda, "torch_cuda")))
        if torch_cuda
        else None,
        gpus=gpus,
    )


def _gpus_from_nvidia_smi(notes: list[str]) -> list[Gpu]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        notes.append(f"nvidia-smi failed: {exc}")
        return []
    gpus = []
    for line in out.splitlines():
        name, _, cap = line.rpartition(",")
        try:
            gpus.append(Gpu(name.strip(), _version_pair(cap, "nvidia-smi compute_cap")))
        except BadInput:
            notes.append(f"nvidia-smi line not understood: {line!r}")
    return gpus


def _musl_version() -> tuple[int, int] | None:
    """The musl version of a musl Linux (Alpine), from its dynamic loader; None if not musl."""
    for loader in sorted(Path("/lib").glob("ld-musl-*.so.1")):
        try:
            out = subprocess.run([str(loader)], capture_output=True, text=True, timeout=10).stderr
        except (OSError, subprocess.SubprocessError):
            continue
        match = re.search(r"^Version (\d+)\.(\d+)", out, re.MULTILINE)
        if match:
            return int(match.group(1)), int(match.group(2))
    return None


def torch_facts_without_import() -> tuple[str, str | None] | None:
    """(torch's version, its CUDA or None) read from torch/version.py as literals, without
    importing torch (--no-torch: importing it can be slow or broken); None when torch is not
    installed or that file is not understood."""
    try:
        spec = importlib.util.find_spec("torch")  # locates the package, does not import it
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        try:
            tree = ast.parse((Path(root) / "version.py").read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        values = {}
        for node in tree.body:  # `__version__ = '...'` and `cuda: Optional[str] = '13.0'`
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            else:
                continue
            if isinstance(target, ast.Name):
                try:
                    values[target.id] = ast.literal_eval(value)
                except ValueError:
                    pass
        if isinstance(values.get("__version__"), str):
            cuda = values.get("cuda")
            return values["__version__"], cuda if isinstance(cuda, str) else None
    return None


def detect_machine(use_torch: bool = True) -> Machine:
    """Inspect this machine. Never raises for a missing torch or GPU: those are answers."""
    if sys.platform.startswith("linux"):
        os_name = "linux"
    elif sys.platform in ("win32", "cygwin"):
        os_name = "windows"
    elif sys.platform == "darwin":
        os_name = "macos"
    else:
        os_name = sys.platform
    notes: list[str] = []
    machine = Machine(
        os=os_name,
        arch=_ARCH_ALIASES.get(platform.machine().lower(), platform.machine().lower()),
        python=(sys.version_info[0], sys.version_info[1]),
        implementation=sys.implementation.name,
        free_threaded=bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
        notes=notes,
    )
    if os_name == "linux":
        lib, ver = platform.libc_ver()
        if lib == "glibc" and ver:
            machine.glibc = _version_pair(ver, "glibc")
        else:
            machine.musl = _musl_version()
            if machine.musl is None:
                notes.append(
                    "could not determine the C library (glibc or musl); assuming manylinux "
                    "wheels work"
                )
    if use_torch:
        try:
            import torch  # noqa: PLC0415 - optional dependency
        except ImportError:
            pass
        except Exception as exc:  # a broken torch install is worth reporting, not crashing on
            notes.append(f"importing torch failed: {exc}")
        else:
            machine.torch = str(torch.__version__)
            machine.torch_cuda = getattr(torch.version, "cuda", None)
            try:
                if torch.cuda.is_available():
                    for i in range(torch.cuda.device_count()):
                        machine.gpus.append(
                            Gpu(
                                torch.cuda.get_device_name(i),
                                tuple(torch.cuda.get_device_capability(i)),
                            )
                        )
            except Exception as exc:
                notes.append(f"torch could not query the GPUs: {exc}")
    else:
        facts = torch_facts_without_import()
        if facts is not None:
            machine.torch, machine.torch_cuda = facts
            notes.append("torch's version read from torch/version.py (--no-torch: not imported)")
    if not machine.gpus:
        machine.gpus = _gpus_from_nvidia_smi(notes)
        if machine.gpus and use_torch and machine.torch_cuda:
            # A CUDA torch that was asked saw none of them. The wheel still fits by its GPU,
            # but no CUDA kernel runs until torch can use the GPU: say so rather than answer as
            # if all were well.
            notes.append(
                f"torch {machine.torch} (CUDA {machine.torch_cuda}) cannot use the "
                f"{len(machine.gpus)} GPU(s) nvidia-smi lists: the NVIDIA driver may be too old "
                f"for CUDA {machine.torch_cuda} (nvidia-smi's header shows the newest "
                f"CUDA it supports), or CUDA_VISIBLE_DEVICES hides them. The wheel below "
                f"fits the GPU; sageattention runs on it once torch can use it"
            )
    return machine


# ---------------------------------------------------------------- the manifest


def load_manifest(source: str) -> tuple[dict, str]:
    """Read a manifest from a path or URL; returns (manifest, base for relative URLs)."""
    try:
        parsed = urllib.parse.urlparse(source)
        if parsed.scheme in ("http", "https", "file"):
            with urllib.request.urlopen(source, timeout=30) as resp:  # noqa: S310 - user-given URL
                text = resp.read().decode("utf-8")
            base = source
        else:
            path = Path(source)
            text = path.read_text(encoding="utf-8")
            base = path.resolve().as_uri()
    except (
        OSError,
        urllib.error.URLError,
        http.client.HTTPException,  # InvalidURL: a host with a space; a broken reply
        UnicodeDecodeError,
        ValueError,  # a URL urlparse refuses, e.g. 'http://[::1'
    ) as exc:
        raise BadInput(f"cannot read manifest {source}: {exc}") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"manifest {source} is not JSON: {exc}") from None
    validate_manifest(manifest)
    return manifest, base


_REQUIRED_WHEEL_KEYS = (
    "filename",
    "url",
    "sha256",
    "version",
    "tags",
    "torch",
    "cuda",
    "gpu_targets",
)


def validate_manifest(manifest: object) -> None:
    if not isinstance(manifest, dict):
        raise BadInput("manifest: expected a JSON object")
    if manifest.get("schema_version") != MANIFEST_SCHEMA_VERSION:
        raise BadInput(
            f"manifest: schema_version {manifest.get('schema_version')!r} is not supported "
            f"(this picker reads {MANIFEST_SCHEMA_VERSION}); get a newer pick_wheel.py"
        )
    wheels = manifest.get("wheels")
    if not isinstance(wheels, list):
        raise BadInput("manifest: 'wheels' must be a list")
    if not isinstance(manifest.get("index") or {}, dict):
        raise BadInput("manifest: 'index' must be an object")
    for i, w in enumerate(wheels):
        if not isinstance(w, dict):
            raise BadInput(f"manifest: wheels[{i}] is not an object")
        missing = [k for k in _REQUIRED_WHEEL_KEYS if k not in w]
        if missing:
            raise BadInput(f"manifest: wheels[{i}] lacks {missing}")
        for key in ("filename", "url", "sha256", "version"):
            if not isinstance(w[key], str):
                raise BadInput(f"manifest: wheels[{i}].{key} must be a string, got {w[key]!r}")
        if not isinstance(w.get("validation") or {}, dict):
            raise BadInput(f"manifest: wheels[{i}].validation must be an object")
        if not isinstance(w["gpu_targets"], list):
            raise BadInput(f"manifest: wheels[{i}].gpu_targets must be a list of {{'cc': ...}}")
        if not isinstance(w["tags"], list) or not all(
            isinstance(t, str) and t.count("-") == 2 for t in w["tags"]
        ):
            raise BadInput(
                f"manifest: wheels[{i}].tags must be a list of 'python-abi-platform' tags"
            )
        for j, t in enumerate(w["gpu_targets"]):
            if not isinstance(t, dict) or "cc" not in t:
                raise BadInput(f"manifest: wheels[{i}].gpu_targets[{j}] needs 'cc'")
            _cc_of(t["cc"], f"manifest: wheels[{i}].gpu_targets[{j}].cc")
            reach = t.get("ptx_serves")
            if reach is not None:
                if not isinstance(reach, list):
                    raise BadInput(f"manifest: wheels[{i}].gpu_targets[{j}].ptx_serves must be "
                                   f"null or a list of compute capabilities, got {reach!r}")
                for cc in reach:
                    _cc_of(cc, f"manifest: wheels[{i}].gpu_targets[{j}].ptx_serves")
        _version_pair(w["torch"], f"manifest: wheels[{i}].torch")
        _version_pair(w["cuda"], f"manifest: wheels[{i}].cuda")


# ---------------------------------------------------------------- matching rules (pure)


def platform_fits(platform_tag: str, m: Machine) -> bool:
    if m.os == "windows":
        return platform_tag == ("win32" if m.arch == "x86" else f"win_{_WINDOWS_ARCH_TAG[m.arch]}")
    if m.os != "linux":
        return False
    match = re.fullmatch(r"musllinux_(\d+)_(\d+)_(\w+)", platform_tag)
    if match:
        return (
            m.musl is not None
            and match.group(3) == m.arch
            and m.musl >= (int(match.group(1)), int(match.group(2)))
        )
    if m.musl is not None:  # manylinux wheels need glibc (PEP 600); our unrepaired linux_* too
        return False
    if platform_tag == f"linux_{m.arch}":
        return True
    for legacy, glibc in _LEGACY_MANYLINUX.items():
        if platform_tag == f"{legacy}_{m.arch}":
            return m.glibc is None or m.glibc >= glibc
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform_tag)
    if match and match.group(3) == m.arch:
        return m.glibc is None or m.glibc >= (int(match.group(1)), int(match.group(2)))
    return False


def python_fits(interpreter: str, abi: str, m: Machine) -> bool:
    if m.implementation != "cpython":
        return False
    ours = f"cp{m.python[0]}{m.python[1]}"
    if m.free_threaded:  # only wheels built for the free-threaded ABI load there
        return interpreter == ours and abi == ours + "t"
    if abi == "abi3":
        match = re.fullmatch(r"cp3(\d+)", interpreter)
        return bool(match) and m.python[0] == 3 and int(match.group(1)) <= m.python[1]
    return interpreter == ours and abi in (ours, "none")


def _tags(w: dict) -> list[tuple[str, str, str]]:
    return [tuple(t.split("-")) for t in w["tags"]]  # type: ignore[misc]


def wheel_platform_fits(w: dict, m: Machine) -> bool:
    return any(platform_fits(p, m) for _, _, p in _tags(w))


def wheel_python_fits(w: dict, m: Machine) -> bool:
    return any(python_fits(i, a, m) and platform_fits(p, m) for i, a, p in _tags(w))


def gpu_execution(w: dict, cc: tuple[int, int]) -> tuple[int, str] | None:
    """How this wheel's code runs on a GPU of ``cc``: (rank, description), lower rank is better.

    SASS runs on the same major with an equal or higher minor (sm_90a-style targets only on exactly
    that GPU); embedded PTX is JIT-compiled by the driver on a newer GPU where the runtime uses it:
    the target's ``ptx_serves`` (a '+PTX' target: the GPUs its kernel families serve), or any
    newer GPU where that is null or absent (the sm75 family's compute_75).
    """
    best: tuple[int, str] | None = None
    for t in w["gpu_targets"]:
        tcc = _cc_of(t["cc"], "gpu_targets.cc")
        name = t.get("name", f"sm{tcc[0]}{tcc[1]}")
        option = None
        same_major_older = not t.get("arch_specific") and tcc[0] == cc[0] and tcc[1] < cc[1]
        if t.get("sass", True) and (tcc == cc or same_major_older):
            # exact SASS first, then the closest older minor of the same major
            option = (0 if tcc == cc else 100 - tcc[1], f"native {name} code")
        elif t.get("ptx") and tcc <= cc and _ptx_serves(t, cc):
            # PTX last: JIT cost on first use, and older instructions; the newest PTX wins
            option = (
                1000 - (tcc[0] * 10 + tcc[1]),
                f"{name} PTX compiled by the driver (JIT) on first use",
            )
        if option and (best is None or option[0] < best[0]):
            best = option
    return best


def _ptx_serves(target: dict, cc: tuple[int, int]) -> bool:
    """Whether the runtime runs this target's PTX on a GPU of ``cc`` (its ``ptx_serves``)."""
    reach = target.get("ptx_serves")
    return reach is None or cc in {_cc_of(x, "ptx_serves") for x in reach}


def _torch_pair(w: dict) -> tuple[int, int]:
    return _version_pair(w["torch"], "torch")


def _fmt_targets(ws: list[dict]) -> str:
    """Compute capabilities the wheels in ``ws`` support, in order ('+': and newer, via PTX)."""
    seen = set()
    for w in ws:
        for t in w["gpu_targets"]:
            cc = _cc_of(t["cc"], "cc")
            seen.add((cc, bool(t.get("ptx")) and t.get("ptx_serves") is None))
            for other in (t.get("ptx_serves") or []) if t.get("ptx") else []:
                seen.add((_cc_of(other, "ptx_serves"), False))
    return ", ".join(f"{a}.{b}" + ("+ (PTX)" if ptx else "") for (a, b), ptx in sorted(seen))


def _fmt_pairs(pairs: set[tuple[int, int]]) -> str:
    items = [f"{a}.{b}" for a, b in sorted(pairs)]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@dataclass
class Verdict:
    wheel: dict | None
    execution: str | None
    reason: str | None
    nearest: list[dict]
    cautions: list[str] = field(default_factory=list)  # the wheel fits, but read these first


def choose(manifest: dict, m: Machine) -> Verdict:
    """The best wheel for ``m``, or the first requirement no wheel meets and the nearest wheels."""
    wheels = list(manifest["wheels"])
    if not wheels:
        return Verdict(None, None, "the manifest lists no wheels", [])

    def step(survivors, keep, why):
        kept = [w for w in survivors if keep(w)]
        return kept, (None if kept else why(survivors))

    machine_pf = f"{m.os} {m.arch}{m.libc()}"
    steps = [
        (
            lambda w: wheel_platform_fits(w, m),
            lambda ws: (
                f"no wheel for {machine_pf}; wheels exist for: "
                + ", ".join(sorted({p for w in ws for _, _, p in _tags(w)}))
            ),
        ),
        (
            lambda w: wheel_python_fits(w, m),
            lambda ws: (
                f"no wheel for {_impl_name(m)} {m.python[0]}.{m.python[1]} on {m.os}; "
                "wheels exist for " + ", ".join(sorted({i for w in ws for i, _, _ in _tags(w)}))
            ),
        ),
        (
            lambda w: m.torch is not None,
            lambda ws: (
                "torch is not installed; install torch first (wheels exist for torch "
                + _fmt_pairs({_torch_pair(w) for w in ws})
                + " with CUDA "
                + _fmt_pairs({_version_pair(w["cuda"], "cuda") for w in ws})
                + "), then run this again"
            ),
        ),
        (
            lambda w: _torch_pair(w) == _version_pair(m.torch, "torch"),
            lambda ws: (
                f"your torch is {'.'.join(map(str, _version_pair(m.torch, 'torch')))}; wheels for "
                f"{m.os}/cp{m.python[0]}{m.python[1]} exist for torch "
                + _fmt_pairs({_torch_pair(w) for w in ws})
            ),
        ),
        (
            lambda w: (
                m.torch_cuda is not None
                and _version_pair(w["cuda"], "cuda") == _version_pair(m.torch_cuda, "torch_cuda")
            ),
            lambda ws: (
                (
                    f"your torch {m.torch} is a ROCm (AMD GPU) build, which no wheel serves"
                    if m.torch_build() == "ROCm build"
                    else f"your torch {m.torch} is a CPU-only build"
                    if m.torch_cuda is None
                    else f"your torch is built with CUDA {m.torch_cuda}"
                )
                + "; the wheels for it need a torch built with CUDA "
                + _fmt_pairs({_version_pair(w["cuda"], "cuda") for w in ws})
            ),
        ),
        (
            lambda w: bool(m.gpus),
            lambda ws: (
                "no NVIDIA GPU found (torch and nvidia-smi see none); these wheels need a GPU "
                "of compute capability " + _fmt_targets(ws)
            ),
        ),
        (
            lambda w: all(gpu_execution(w, g.cc) for g in m.gpus),
            lambda ws: (
                "your GPU " + "; ".join(g.describe() for g in m.gpus) + " is not supported by "
                "any wheel that fits the rest of this machine; they support compute capability "
                + _fmt_targets(ws)
            ),
        ),
    ]
    survivors = wheels
    for keep, why in steps:
        kept, reason = step(survivors, keep, why)
        if reason:
            return Verdict(None, None, reason, survivors[:5])
        survivors = kept

    def rank(w: dict):
        gpu_rank = max(gpu_execution(w, g.cc)[0] for g in m.gpus)  # type: ignore[index]
        version = tuple(int(x) for x in re.findall(r"\d+", w["version"].split("+")[0]))
        return (gpu_rank, tuple(-v for v in version), w["filename"])

    best = min(survivors, key=rank)
    execution = "; ".join(
        f"GPU {i}: {gpu_execution(best, g.cc)[1]}"  # type: ignore[index]
        for i, g in enumerate(m.gpus)
    )
    cautions = []
    if _prerelease_torch(m.torch):
        pair = ".".join(map(str, _torch_pair(best)))
        cautions.append(
            f"your torch {m.torch} is a pre-release, nightly or source build; this wheel was "
            f"built against the torch {pair} release ({best.get('torch')}), and a build from "
            f"before or beside that release may not share its C++ ABI (an 'undefined symbol' "
            f"error at import). Use a torch {pair}.x release, or build sageattention from source "
            f"against your torch"
        )
    return Verdict(best, execution, None, [], cautions)


# PEP 440's pre-release (a/b/rc) and dev segments; the picker is standard-library only, so no
# `packaging` here. A local label of "git..." marks a source build.
_PRERELEASE = re.compile(r"v?\d+(?:\.\d+)*[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview|dev)", re.IGNORECASE)


def _prerelease_torch(version: str | None) -> bool:
    """Whether a torch version is a pre-release, nightly (.dev) or source (+git...) build."""
    if not version:
        return False
    public, _, local = version.partition("+")
    return bool(_PRERELEASE.match(public)) or local.lower().startswith("git")


# ---------------------------------------------------------------- output


def _resolve(base: str, ref: str) -> str:
    url = urllib.parse.urljoin(base, urllib.parse.quote(ref, safe="/:%#?=&"))
    if url.startswith("file://"):
        return urllib.request.url2pathname(urllib.parse.urlparse(url).path)
    return url


def install_commands(manifest: dict, base: str, w: dict) -> dict:
    where = _resolve(base, w["url"])
    commands = {
        "pip": f'python -m pip install "{where}"',
        "uv": f'uv pip install "{where}"',
    }
    index_info = manifest.get("index") or {}
    index_url = index_info.get("url")
    if index_url and w.get("local_label"):
        variant = urllib.parse.urljoin(
            index_url if index_url.endswith("/") else index_url + "/",
            urllib.parse.quote(w["local_label"]) + "/",
        )
    elif base.startswith("file://") and w.get("index"):
        variant = urllib.parse.urljoin(base, w["index"])  # a local release folder
    else:
        variant = None
    if variant:
        pin = f'"sageattention=={w["version"]}"'
        commands["pip_index"] = f"python -m pip install --index-url {variant} {pin}"
        commands["uv_index"] = f"uv pip install --index-url {variant} {pin}"
    return commands


def render_text(m: Machine, v: Verdict, commands: dict | None) -> str:
    lines = [f"This machine: {m.describe()}"]
    lines += [f"  note: {n}" for n in m.notes]
    if v.wheel is not None and commands is not None:
        w = v.wheel
        val = w.get("validation") or {}
        lines += [
            "",
            "The wheel for it:",
            f"  {w['filename']}",
            f"  sha256 {w['sha256']}",
            f"  runs as {v.execution}",
        ]
        if val:
            skipped = val.get("checks_skipped")
            lines.append(
                f"  validated on {val.get('gpu_name')} "
                f"(compute capability {val.get('compute_capability')}, "
                f"{val.get('execution')}): {val.get('checks_passed')} checks passed"
                + (f", {skipped} skipped" if skipped else "")
            )
            if val.get("execution") == "ptx-jit":
                # The run compiled the wheel's PTX for a GPU it has no SASS for.
                lines.append(
                    "  (that run checks this wheel's code path through the driver's PTX JIT, "
                    "not the hardware its SASS is for)"
                )
        if w.get("note"):
            lines.append(f"  notes: {w['note']}")
        lines += [f"  caution: {c}" for c in v.cautions]
        lines += [
            "",
            "Install it with pip:",
            f"  {commands['pip']}",
            "or with uv:",
            f"  {commands['uv']}",
        ]
        if "pip_index" in commands:
            lines += [
                "or from the index:",
                f"  {commands['pip_index']}",
                f"  {commands['uv_index']}",
            ]
    else:
        lines += ["", f"No wheel fits: {v.reason}"]
        if v.nearest:
            lines.append("Nearest options:")
            lines += [f"  {w['filename']}" for w in v.nearest]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pick_wheel.py",
        description="Print the sageattention wheel that fits this machine, and how to install it.",
        epilog=(
            "exit codes: 0 a wheel fits; 1 none fits (the reason and the nearest options are "
            "printed); 2 bad manifest, bad --env-json or bad arguments. --env-json fields: "
            "os (linux|windows|macos), arch, python ('3.12'; '3.13t' free-threaded), optional "
            "implementation, free_threaded, glibc ('2.35') or musl ('1.2'), torch "
            "('2.12.0+cu130'), torch_cuda ('13.0' or null for a CPU build; taken from torch's "
            "+cuXYZ / +cpu / +rocmX.Y label when left out), gpus ([{name, compute_capability: "
            "'7.5'}])."
        ),
    )
    parser.add_argument(
        "--manifest", required=True, help="path or URL of the release's manifest.json"
    )
    parser.add_argument(
        "--env-json", type=Path, help="describe the machine in a JSON file instead of inspecting it"
    )
    parser.add_argument(
        "--no-torch",
        action="store_true",
        help="do not import torch: its version and CUDA are read from torch/version.py as text, "
        "the GPUs from nvidia-smi",
    )
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.env_json and args.no_torch:
        parser.error(
            "--no-torch changes how this machine is inspected; with --env-json nothing is "
            "inspected (describe torch in the file: \"torch\": null)"
        )
    try:
        manifest, base = load_manifest(args.manifest)
        if args.env_json:
            try:
                data = json.loads(args.env_json.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise BadInput(f"cannot read --env-json {args.env_json}: {exc}") from None
            machine = machine_from_json(data)
        else:
            machine = detect_machine(use_torch=not args.no_torch)
        verdict = choose(manifest, machine)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    commands = install_commands(manifest, base, verdict.wheel) if verdict.wheel else None
    if args.json:
        print(
            json.dumps(
                {
                    "status": "found" if verdict.wheel else "none-fits",
                    "machine": asdict(machine),
                    "wheel": verdict.wheel,
                    "runs_as": verdict.execution,
                    "cautions": verdict.cautions,
                    "commands": commands,
                    "reason": verdict.reason,
                    "nearest": [w["filename"] for w in verdict.nearest],
                },
                indent=2,
            )
        )
    else:
        print(render_text(machine, verdict, commands))
    return EXIT_FOUND if verdict.wheel else EXIT_NONE_FITS


if __name__ == "__main__":
    sys.exit(main())
