#!/usr/bin/env python3
"""Pick the one sageattention wheel that fits this machine from a release's manifest.json.

Standard library only; torch is used when installed (for its version, its CUDA and the GPUs), and
nvidia-smi when torch cannot see a GPU. Prints the exact wheel and the pip / uv command to install
it, or, when none fits, why, the nearest options and what to do. Only wheels that passed
validation (and are not yanked) are ever offered.

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


def _interpreter_arch(os_name: str) -> str:
    """The CPU architecture this interpreter is built for, which is what its wheels must match
    (pip's rule), not the machine's: platform.machine() says AMD64 to a 32-bit Python on 64-bit
    Windows, and ARM64 to an x64 Python emulated on Windows on Arm; sysconfig.get_platform() says
    win32 / win-amd64 / win-arm64, the interpreter's own build. On Linux a 32-bit interpreter on
    a 64-bit kernel loads only 32-bit wheels."""
    machine = platform.machine().lower()
    if os_name == "windows":
        machine = {"win32": "x86", "win-amd64": "x86_64", "win-arm64": "aarch64"}.get(
            sysconfig.get_platform().lower(), machine)
    arch = _ARCH_ALIASES.get(machine, machine)
    if os_name == "linux" and sys.maxsize <= 2**32:
        arch = {"x86_64": "x86", "aarch64": "armv8l"}.get(arch, arch)
    return arch


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
        arch=_interpreter_arch(os_name),
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
            if path.is_dir():
                raise BadInput(f"--manifest {source} is a folder; give the release's manifest.json "
                               f"(for a release folder: {path / 'manifest.json'})")
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
        if text.lstrip().startswith("<"):  # a release page or a package index, not its manifest
            raise BadInput(
                f"--manifest {source} is a web page (HTML), not a release's manifest.json: give "
                "the manifest.json asset of the release, such as https://github.com/OWNER/REPO/"
                "releases/download/TAG/manifest.json (not the release page or a package index)"
            ) from None
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


_SHA256 = re.compile(r"[0-9a-f]{64}")
# A PEP 440 version in any spelling packaging.version.Version accepts (v2.2, 2.2.0rc1,
# 2.2.0.post1.dev2, 1!2.2+local.label): a wheel whose name holds anything else is not a wheel
# pip installs.
_PEP440 = re.compile(
    r"""\s*v?
    (?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*
    (?:[-_.]?(?:alpha|a|beta|b|preview|pre|c|rc)[-_.]?[0-9]*)?
    (?:-[0-9]+|[-_.]?(?:post|rev|r)[-_.]?[0-9]*)?
    (?:[-_.]?dev[-_.]?[0-9]*)?
    (?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?\s*""",
    re.VERBOSE | re.IGNORECASE,
)
_TAG_PART = re.compile(r"[A-Za-z0-9_]+")  # one tag of a python, abi or platform tag set


def _canonical_name(name: str) -> str:
    """A project name normalized as PEP 503 says (packaging.utils.canonicalize_name)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class WheelName:
    """What a wheel file name says (the wheel spec, PEP 427 / PEP 491)."""

    project: str  # canonical (PEP 503)
    version: str  # as written
    build: tuple[int, str] | tuple[()]  # (1, "") for "-1-"; () without a build tag
    tags: frozenset[str]  # expanded: "cp312-cp312-manylinux_2_28_x86_64", one per combination


def parse_wheel_name(filename: str) -> WheelName:
    """Parse a wheel file name as packaging.utils.parse_wheel_filename does (the picker needs only
    the standard library; tests/unit/test_picker_audit.py checks the two agree). BadInput says
    what is wrong."""
    expected = ("expected '<name>-<version>[-<build>]-<python tag>-<abi tag>-<platform tag>.whl' "
                "(for example sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-"
                "manylinux_2_28_x86_64.whl)")
    if not filename.endswith(".whl"):
        raise BadInput(f"{filename!r} is not a wheel file name (no .whl); {expected}")
    parts = filename[: -len(".whl")].split("-")
    if len(parts) not in (5, 6) or not all(parts):
        raise BadInput(f"{filename!r} is not a wheel file name; {expected}")
    build: tuple[int, str] | tuple[()] = ()
    if len(parts) == 6:
        match = re.fullmatch(r"([0-9]+)(.*)", parts[2])
        if match is None:
            raise BadInput(f"{filename!r}: build tag {parts[2]!r} must start with a digit")
        build = (int(match.group(1)), match.group(2))
    if not re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?", parts[0]):
        raise BadInput(f"{filename!r}: {parts[0]!r} is not a project name; {expected}")
    if not _PEP440.fullmatch(parts[1]):
        raise BadInput(f"{filename!r}: {parts[1]!r} is not a version (PEP 440); {expected}")
    sets = [p.split(".") for p in parts[-3:]]
    if not all(_TAG_PART.fullmatch(t) for s in sets for t in s):
        raise BadInput(f"{filename!r}: its tags {'-'.join(parts[-3:])!r} are not "
                       f"'python-abi-platform' tags; {expected}")
    tags = frozenset(f"{i}-{a}-{p}".lower() for i in sets[0] for a in sets[1] for p in sets[2])
    return WheelName(_canonical_name(parts[0]), parts[1], build, tags)


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
    index_url = (manifest.get("index") or {}).get("url")
    if index_url is not None and not isinstance(index_url, str):
        raise BadInput(f"manifest: index.url must be a URL (a string) or null, got {index_url!r}")
    refused = manifest.get("refused")
    if refused is not None and not (isinstance(refused, list) and all(
            isinstance(r, dict) and isinstance(r.get("filename"), str) for r in refused)):
        raise BadInput(f"manifest: 'refused' must be a list of {{'filename': ..., 'reasons': "
                       f"[...]}}, got {refused!r}")
    for i, w in enumerate(wheels):
        if not isinstance(w, dict):
            raise BadInput(f"manifest: wheels[{i}] is not an object")
        missing = [k for k in _REQUIRED_WHEEL_KEYS if k not in w]
        if missing:
            raise BadInput(f"manifest: wheels[{i}] lacks {missing}")
        for key in ("filename", "url", "sha256", "version"):
            if not isinstance(w[key], str) or not w[key].strip():
                raise BadInput(f"manifest: wheels[{i}].{key} must be a non-empty string, "
                               f"got {w[key]!r}")
        if not _SHA256.fullmatch(w["sha256"]):
            raise BadInput(f"manifest: wheels[{i}].sha256 must be 64 lowercase hex digits "
                           f"(hashlib's hexdigest), got {w['sha256']!r}")
        if w.get("index") is not None and not isinstance(w["index"], str):
            raise BadInput(f"manifest: wheels[{i}].index must be a path such as "
                           f"'simple/sm75.torch2.12cu130/' or null, got {w['index']!r}")
        if not isinstance(w.get("validation") or {}, dict):
            raise BadInput(f"manifest: wheels[{i}].validation must be an object")
        if not isinstance(w["gpu_targets"], list) or not w["gpu_targets"]:
            raise BadInput(f"manifest: wheels[{i}].gpu_targets must be a non-empty list of "
                           f"{{'cc': ...}}, got {w['gpu_targets']!r}")
        if not isinstance(w["tags"], list) or not w["tags"] or not all(
            isinstance(t, str) and t.count("-") == 2 and all(
                _TAG_PART.fullmatch(part) for part in t.split("-"))
            for t in w["tags"]
        ):
            raise BadInput(
                f"manifest: wheels[{i}].tags must be a list of expanded 'python-abi-platform' "
                f"tags such as 'cp312-cp312-manylinux_2_28_x86_64', got {w['tags']!r}"
            )
        try:
            name = parse_wheel_name(w["filename"])
        except BadInput as exc:
            raise BadInput(f"manifest: wheels[{i}].filename: {exc}") from None
        said = {
            "project": (name.project, "sageattention"),
            "version": (name.version, w["version"]),
            "tags": (sorted(name.tags), sorted(t.lower() for t in w["tags"])),
        }
        if w.get("local_label") is not None:
            said["local_label"] = (w["version"].partition("+")[2], w["local_label"])
        for key, (from_name, listed) in said.items():
            if from_name != listed:
                raise BadInput(
                    f"manifest: wheels[{i}] says {key} {listed!r}, but its file name "
                    f"{w['filename']!r} says {from_name!r}; the entry must describe its file"
                )
        if w.get("yanked") not in (None, False) and not isinstance(w["yanked"], (bool, str)):
            raise BadInput(f"manifest: wheels[{i}].yanked must be true, false or a reason "
                           f"(a string), got {w['yanked']!r}")
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
        for key, example in (("torch", "2.11.0+cu130"), ("cuda", "13.0")):
            if not (isinstance(w[key], str) and re.match(r"^\d+\.\d+", w[key])):
                raise BadInput(f"manifest: wheels[{i}].{key} must be a version such as "
                               f"{example!r}, got {w[key]!r}")
    first: dict[str, int] = {}
    for i, w in enumerate(wheels):
        j = first.setdefault(w["filename"], i)
        if j != i and wheels[j] != w:  # the same entry twice is harmless; two stories are not
            raise BadInput(f"manifest: wheels[{j}] and wheels[{i}] are both "
                           f"{w['filename']!r} but differ; one file has one entry")
    # One release, one version: the wheels differ by their label, never by their version, so
    # which version is newer never decides between them.
    versions = {w["version"].partition("+")[0] for w in wheels}
    if manifest.get("version") is not None:
        versions.add(str(manifest["version"]))
    if len(versions) > 1:
        raise BadInput(f"manifest: wheels of several versions {sorted(versions)} (with the "
                       "manifest's 'version'); a release manifest lists one version's wheels")


# ---------------------------------------------------------------- matching rules (pure)


def platform_fits(platform_tag: str, m: Machine) -> bool:
    if m.os == "windows":  # an arch without a Windows wheel tag (detected, not --env-json)
        return m.arch in _WINDOWS_ARCH_TAG and platform_tag == (
            "win32" if m.arch == "x86" else f"win_{_WINDOWS_ARCH_TAG[m.arch]}")
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
    # tags compare lowercased, as packaging reads them (validate_manifest allows any case)
    return [tuple(t.lower().split("-")) for t in w["tags"]]  # type: ignore[misc]


def _tag_rank(w: dict, m: Machine) -> tuple:
    """How much pip would prefer this wheel's best tag that fits ``m`` (lower is better), as
    packaging.tags orders them: the interpreter's own ABI, then abi3 of the newest cpXY, then
    'none'; within that the most specific platform: the newest manylinux / musllinux glibc
    (musl), the legacy manylinux names by their glibc, and an unrepaired linux_* last."""
    best: tuple | None = None
    for i, a, p in _tags(w):
        if not (python_fits(i, a, m) and platform_fits(p, m)):
            continue
        if a == "abi3":
            minor = re.fullmatch(r"cp3(\d+)", i)
            python_rank: tuple = (1, -int(minor.group(1)) if minor else 0)
        else:
            python_rank = (0, 0) if a != "none" else (2, 0)
        libc = _glibc_needed(p) or _musl_needed(p)
        platform_rank = (0, -libc[0], -libc[1]) if libc else (1, 0, 0) if p.startswith(
            "linux_") else (0, 0, 0)
        option = (python_rank, platform_rank)
        if best is None or option < best:
            best = option
    return best or ((9, 0), (9, 0, 0))


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
    todo: list[str] = field(default_factory=list)  # none fits: what to do about it


def not_offered(w: dict, refused: set[str]) -> str | None:
    """Why a manifest entry must never be offered, or None. A release publishes only wheels that
    passed GPU validation; an entry that says otherwise (edited, or from another tool) is skipped."""
    if w.get("yanked"):
        return "yanked" + (f" ({w['yanked']})" if isinstance(w["yanked"], str) else "")
    if w["filename"] in refused:
        return "listed under 'refused' (not published)"
    status = (w.get("validation") or {}).get("status")
    if status != "passed":
        return ("not validated (no validation record)" if status is None
                else f"validation status {status!r}, not 'passed'")
    return None


def cuda_fits(wheel_cuda: str, torch_cuda: str | None) -> bool:
    """A wheel built with CUDA X.Y loads under a torch built with CUDA X.anything: the runtime
    guard's rule (sageattention/guard.py import_problem: the same CUDA major)."""
    return torch_cuda is not None and (
        _version_pair(wheel_cuda, "cuda")[0] == _version_pair(torch_cuda, "torch_cuda")[0]
    )


def _fmt_python(ws: list[dict]) -> str:
    """The Python builds the wheels in ``ws`` are for: cp312, cp313t (free-threaded), cp39-abi3."""
    names = set()
    for w in ws:
        for i, a, _ in _tags(w):
            names.add(i if a in (i, "none") else i + "t" if a == i + "t" else f"{i}-{a}")
    return ", ".join(sorted(names))


def _source_build(manifest: dict) -> str:
    version = manifest.get("version") or manifest["wheels"][0]["version"].partition("+")[0]
    return (f"build from source against your torch: python -m pip install --no-build-isolation "
            f"sageattention-{version}.tar.gz (the sdist; it compiles for the GPUs it sees, and "
            f"stops naming what is missing; README.md, 'Installing from source')")


def _torch_install(ws: list[dict]) -> str:
    """The pip command for the torch of the newest (torch, CUDA) pair among ``ws``."""
    t, c = max((_torch_pair(w), _version_pair(w["cuda"], "cuda")) for w in ws)
    return (f'python -m pip install "torch=={t[0]}.{t[1]}.*" --index-url '
            f"https://download.pytorch.org/whl/cu{c[0]}{c[1]}")


def choose(manifest: dict, m: Machine) -> Verdict:
    """The best wheel for ``m``, or the first requirement no wheel meets, the nearest wheels and
    what to do. Only wheels that passed validation and are not yanked are ever offered."""
    refused = {r.get("filename") for r in manifest.get("refused") or [] if isinstance(r, dict)}
    listed = list(manifest["wheels"])
    wheels = [w for w in listed if not_offered(w, refused) is None]
    held_back = [w for w in listed if not_offered(w, refused) is not None]
    if not listed:
        return Verdict(None, None, "the manifest lists no wheels", [])

    python = f"{_impl_name(m)} {m.python[0]}.{m.python[1]}" + (
        "t (free-threaded)" if m.free_threaded else "")
    machine_pf = f"{m.os} {m.arch}{m.libc()}"
    build = _source_build(manifest)
    steps = [
        (
            lambda w: wheel_platform_fits(w, m),
            lambda ws: (
                f"no wheel for {machine_pf}; wheels exist for: "
                + ", ".join(sorted({p for w in ws for _, _, p in _tags(w)}))
            ),
            lambda ws: (
                ["sageattention's kernels need an NVIDIA GPU under Linux or Windows"]
                if m.os == "macos" else [build]
            ),
        ),
        (
            lambda w: wheel_python_fits(w, m),
            lambda ws: f"no wheel for {python} on {m.os}; wheels exist for {_fmt_python(ws)}",
            lambda ws: [f"use a Python these wheels are for ({_fmt_python(ws)}), or {build}"],
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
            lambda ws: [f"install torch, for example: {_torch_install(ws)}; then run this again"],
        ),
        (
            lambda w: _torch_pair(w) == _version_pair(m.torch, "torch"),
            lambda ws: (
                f"your torch is {'.'.join(map(str, _version_pair(m.torch, 'torch')))}; wheels for "
                f"{m.os}/{_fmt_python(ws)} exist for torch "
                + _fmt_pairs({_torch_pair(w) for w in ws})
            ),
            lambda ws: [f"install a torch these wheels are for, for example: "
                        f"{_torch_install(ws)}", f"or {build}"],
        ),
        (
            lambda w: cuda_fits(w["cuda"], m.torch_cuda),
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
                + " (the same CUDA major version)"
            ),
            lambda ws: [f"install a CUDA build of torch that these wheels are for: "
                        f"{_torch_install(ws)}"]
            + ([f"or {build} (with a CUDA toolkit of your torch's major version, "
                f"{m.torch_cuda.split('.')[0]}.x)"] if m.torch_cuda else []),
        ),
        (
            lambda w: bool(m.gpus),
            lambda ws: (
                "no NVIDIA GPU found (torch and nvidia-smi see none); these wheels need a GPU "
                "of compute capability " + _fmt_targets(ws)
            ),
            lambda ws: ["run this on the machine with the NVIDIA GPU (or describe it with "
                        "--env-json)"],
        ),
        (
            lambda w: all(gpu_execution(w, g.cc) for g in m.gpus),
            lambda ws: (
                "your GPU " + m.gpus[0].describe() + " is not supported by any wheel that fits "
                "the rest of this machine; they support compute capability " + _fmt_targets(ws)
                if len(m.gpus) == 1 else
                # several GPUs: say which of them a wheel serves, not that none is supported
                "one wheel must serve every GPU, and no wheel that fits the rest of this machine "
                "serves them all: " + "; ".join(
                    f"GPU {i} {g.describe()}: "
                    + (f"{best_for(ws, g)['filename']} serves it" if best_for(ws, g)
                       else "no wheel serves it") for i, g in enumerate(m.gpus))
                + "; they support compute capability " + _fmt_targets(ws)
            ),
            lambda ws: [
                f"to use only GPU {i} ({g.name}), run this again with CUDA_VISIBLE_DEVICES={i}"
                for i, g in enumerate(m.gpus) if len(m.gpus) > 1 and best_for(ws, g)
            ] + _gpu_todo(listed, [g for g in m.gpus if not best_for(ws, g)] or m.gpus, build),
        ),
    ]

    def rank(w: dict, gpus: list[Gpu] = m.gpus):
        """Lower is better, among wheels that fit everything before the GPUs and serve ``gpus``."""
        torch_cuda = _version_pair(m.torch_cuda, "torch_cuda")  # type: ignore[arg-type]
        gpu_rank = max(gpu_execution(w, g.cc)[0] for g in gpus)  # type: ignore[index]
        cuda = _version_pair(w["cuda"], "cuda")
        # the exact CUDA first, then the nearest older minor (built for less than torch has)
        cuda_rank = (cuda != torch_cuda, cuda > torch_cuda, abs(cuda[1] - torch_cuda[1]))
        # then the tags pip prefers (a manylinux wheel over an unrepaired linux_* one), then
        # the highest build tag, as pip prefers it (PEP 427); none sorts below every number
        build = parse_wheel_name(w["filename"]).build
        return (gpu_rank, cuda_rank, _tag_rank(w, m), -build[0] if build else 1, w["filename"])

    def best_for(ws: list[dict], gpu: Gpu) -> dict | None:
        """The wheel of ``ws`` the picker names for ``gpu`` alone (CUDA_VISIBLE_DEVICES)."""
        serving = [w for w in ws if gpu_execution(w, gpu.cc)]
        return min(serving, key=lambda w: rank(w, [gpu])) if serving else None

    def fits(w: dict) -> bool:
        return all(keep(w) for keep, _, _ in steps)

    survivors = wheels
    for n, (keep, why, todo) in enumerate(steps):
        kept = [w for w in survivors if keep(w)]
        if not kept:
            reason = why(survivors) if survivors else (
                "no wheel in the manifest may be offered (a release publishes only wheels that "
                "passed GPU validation)")
            advice = todo(survivors) if survivors else []
            fitting_held = [w for w in held_back if fits(w)]
            if fitting_held:
                reason += "; " + "; ".join(
                    f"{w['filename']} would fit, but is not offered: {not_offered(w, refused)}"
                    for w in fitting_held)
            elif not survivors:
                reason += ": " + "; ".join(
                    f"{w['filename']}: {not_offered(w, refused)}" for w in held_back[:5])
            def closeness(w: dict, rest=steps[n + 1:]) -> tuple:
                met = 0  # how many of the later requirements it meets
                for later_keep, _, _ in rest:
                    try:
                        met += bool(later_keep(w))
                    except BadInput:  # a requirement that needs what this machine lacks
                        pass
                runs = [gpu_execution(w, g.cc) for g in m.gpus]
                gpu_rank = max(r[0] for r in runs) if runs and all(runs) else 10**6
                return (-met, gpu_rank, w["filename"])

            nearest = sorted(survivors, key=closeness)[:5]
            return Verdict(None, None, reason, nearest, [], advice)
        if n == len(steps) - 2:
            gpu_candidates = kept  # for the multi-GPU caution below
        survivors = kept

    torch_cuda = _version_pair(m.torch_cuda, "torch_cuda")  # type: ignore[arg-type]
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
    if _version_pair(best["cuda"], "cuda") != torch_cuda:
        cautions.append(
            f"this wheel is built with CUDA {best['cuda']} and your torch with CUDA "
            f"{m.torch_cuda}: the same major version, which sageattention accepts (CUDA "
            f"minor-version compatibility); no wheel here is built with CUDA {m.torch_cuda}"
        )
    if m.os == "linux" and m.glibc is None and m.musl is None:
        needs = sorted(filter(None, (_glibc_needed(p) for _, _, p in _tags(best)
                                     if platform_fits(p, m))))
        if needs:
            cautions.append(
                f"this machine's C library is unknown; this wheel needs glibc "
                f"{needs[0][0]}.{needs[0][1]} or newer (ldd --version shows yours)"
            )
    def native(w: dict, cc: tuple[int, int]) -> bool:
        return (gpu_execution(w, cc) or (0, ""))[1].startswith("native")

    for i, g in enumerate(m.gpus):
        if len(m.gpus) > 1 and not native(best, g.cc):
            alone = best_for(gpu_candidates, g)
            if alone is not None and native(alone, g.cc):
                cautions.append(
                    f"GPU {i} ({g.name}) runs this wheel as PTX, because one wheel must serve "
                    f"every GPU; {alone['filename']} runs natively there: to use only GPU {i}, "
                    f"run this again with CUDA_VISIBLE_DEVICES={i}"
                )
    for w in held_back:
        if fits(w):
            cautions.append(f"{w['filename']} would also fit, but is not offered: "
                            f"{not_offered(w, refused)}")
    return Verdict(best, execution, None, [], cautions)


def _gpu_todo(listed: list[dict], gpus: list[Gpu], build: str) -> list[str]:
    """What to do for GPUs no wheel serves. A GPU older than every target of the whole release is
    said to be so; whether a source build serves it is the build's to say (its kernel families)."""
    oldest = min(_cc_of(t["cc"], "cc") for w in listed for t in w["gpu_targets"])
    older = [g for g in gpus if g.cc < oldest]
    if older:
        return [
            f"no wheel of this release runs on compute capability "
            f"{_fmt_pairs({g.cc for g in older})}: its oldest target is {oldest[0]}.{oldest[1]}",
            f"or {build}; if no kernel family serves your GPU, use PyTorch's "
            f"scaled_dot_product_attention",
        ]
    return [build]


def _musl_needed(platform_tag: str) -> tuple[int, int] | None:
    """The musl a musllinux platform tag needs (PEP 656), None for another tag."""
    match = re.match(r"musllinux_(\d+)_(\d+)_", platform_tag)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _glibc_needed(platform_tag: str) -> tuple[int, int] | None:
    """The glibc a manylinux platform tag needs (PEP 600), None for another tag."""
    for legacy, glibc in _LEGACY_MANYLINUX.items():
        if platform_tag.startswith(legacy + "_"):
            return glibc
    match = re.match(r"manylinux_(\d+)_(\d+)_", platform_tag)
    return (int(match.group(1)), int(match.group(2))) if match else None


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
        parts = urllib.parse.urlparse(url)
        # a file URL's host is part of its path (a Windows share: file://server/share/...),
        # except the local host
        host = "" if parts.netloc in ("", "localhost") else "//" + parts.netloc
        return urllib.request.url2pathname(host + parts.path)
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
        if v.todo:
            lines.append("What to do:")
            lines += [f"  {t}" for t in v.todo]
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
                    "what_to_do": verdict.todo,
                },
                indent=2,
            )
        )
    else:
        print(render_text(machine, verdict, commands))
    return EXIT_FOUND if verdict.wheel else EXIT_NONE_FITS


if __name__ == "__main__":
    sys.exit(main())
