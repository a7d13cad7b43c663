"""scripts/pick_wheel.py: choosing the one wheel for synthetic machines, and its CLI contract."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
from picker_module import PICKER, pick_wheel  # noqa: E402

LINUX = "manylinux_2_28_x86_64"
WIN = "win_amd64"


def _wheel(
    label: str, py: str, plat: str, targets: list[str], torch: str, cuda: str = "13.0",
    ptx_serves: list[str] | None = None,
) -> dict:
    filename = f"sageattention-2.2.0+{label}-{py}-{py}-{plat}.whl"
    gpu_targets = []
    for t in targets:
        ptx = t.endswith("+PTX")
        digits = t[2:].removesuffix("+PTX")
        gpu_targets.append(
            {
                "name": t,
                "cc": f"{digits[:-1]}.{digits[-1]}",
                "sass": True,
                "ptx": ptx,
                "arch_specific": False,
                "ptx_serves": ptx_serves if ptx else None,
            }
        )
    return {
        "filename": filename,
        "url": filename,
        "sha256": "0" * 64,
        "version": f"2.2.0+{label}",
        "local_label": label,
        "tags": [f"{py}-{py}-{plat}"],
        "torch": torch,
        "cuda": cuda,
        "gpu_targets": gpu_targets,
        "index": f"simple/{label}/",
        "validation": {
            "status": "passed",
            "gpu_name": "Synthetic",
            "compute_capability": "9.0",
            "execution": "native",
            "checks_passed": 3,
        },
    }


WHEELS = {
    "t4_linux": _wheel("sm75.torch2.12cu130", "cp312", LINUX, ["sm75+PTX"], "2.12.0"),
    "t4_win": _wheel("sm75.torch2.12cu130", "cp312", WIN, ["sm75+PTX"], "2.12.0"),
    "ampere": _wheel("sm80.torch2.12cu130", "cp312", LINUX, ["sm80", "sm86"], "2.12.0"),
    "ada": _wheel("sm89.torch2.12cu130", "cp312", LINUX, ["sm89"], "2.12.0"),
    # compute_89 runs where the sm80 and sm89 families serve (8.9, 9.0), not on newer GPUs
    "ada_ptx": _wheel("sm89.torch2.12cu130", "cp312", WIN, ["sm89+PTX"], "2.12.0",
                      ptx_serves=["8.9", "9.0"]),
    "hopper_212": _wheel("sm90.torch2.12cu130", "cp312", LINUX, ["sm90"], "2.12.0"),
    "hopper_214_311": _wheel("sm90.torch2.14cu130", "cp311", LINUX, ["sm90"], "2.14.1"),
    "hopper_214_312": _wheel("sm90.torch2.14cu130", "cp312", LINUX, ["sm90"], "2.14.1"),
}
MANIFEST = {
    "schema_version": 1,
    "project": "sageattention",
    "version": "2.2.0",
    "index": {"url": "https://example.invalid/simple/"},
    "wheels": list(WHEELS.values()),
}


def machine(
    os="linux",
    arch="x86_64",
    python="3.12",
    glibc="2.35",
    torch="2.12.0+cu130",
    torch_cuda="13.0",
    gpus=(("Tesla T4", "7.5"),),
):
    data = {
        "os": os,
        "arch": arch,
        "python": python,
        "torch": torch,
        "torch_cuda": torch_cuda,
        "gpus": [{"name": n, "compute_capability": cc} for n, cc in gpus],
    }
    if glibc:
        data["glibc"] = glibc
    return data


FITS = [
    # (case, machine, expected wheel key, words in how it runs)
    ("turing linux", machine(), "t4_linux", "native sm75"),
    ("turing windows", machine(os="windows", arch="AMD64", glibc=None), "t4_win", "native sm75"),
    (
        "ampere 8.6 gets its exact SASS",
        machine(gpus=[("RTX 3090", "8.6")]),
        "ampere",
        "native sm86",
    ),
    ("ampere 8.7 runs sm86 SASS", machine(gpus=[("Orin", "8.7")]), "ampere", "native sm86"),
    (
        "ada prefers sm89 over sm86 and PTX",
        machine(gpus=[("RTX 4090", "8.9")]),
        "ada",
        "native sm89",
    ),
    ("hopper torch 2.12", machine(gpus=[("H100", "9.0")]), "hopper_212", "native sm90"),
    (
        "hopper cp311 torch 2.14",
        machine(python="3.11", torch="2.14.1+cu130", gpus=[("H200", "9.0")]),
        "hopper_214_311",
        "native sm90",
    ),
    ("blackwell only via PTX", machine(gpus=[("RTX 5090", "12.0")]), "t4_linux", "PTX"),
    (  # compute_89 would JIT there, but the runtime runs those families only up to sm90
        "blackwell gets compute_75, not a +PTX target it is not served by",
        machine(os="windows", arch="AMD64", glibc=None, gpus=[("RTX 5090", "12.0")]),
        "t4_win",
        "sm75+PTX PTX",
    ),
    (
        "hopper runs an sm89+PTX wheel's compute_89 before compute_75",
        machine(os="windows", arch="AMD64", glibc=None, gpus=[("H100", "9.0")]),
        "ada_ptx",
        "sm89+PTX PTX",
    ),
    (
        "two GPUs need one wheel for both",
        machine(gpus=[("Tesla T4", "7.5"), ("RTX 4090", "8.9")]),
        "t4_linux",
        "GPU 1: sm75+PTX PTX",
    ),
]


@pytest.mark.parametrize("case,env,expected,runs", FITS, ids=[c[0] for c in FITS])
def test_picks_the_right_wheel(case, env, expected, runs):
    verdict = pick_wheel.choose(MANIFEST, pick_wheel.machine_from_json(env))
    assert verdict.reason is None, verdict.reason
    assert verdict.wheel["filename"] == WHEELS[expected]["filename"]
    assert runs in verdict.execution


NONE_FITS = [
    ("no GPU", machine(gpus=[]), "no NVIDIA GPU found", "t4_linux"),
    (
        "unsupported GPU (Pascal)",
        machine(gpus=[("Tesla P100", "6.0")]),
        "Tesla P100 (compute capability 6.0) is not supported",
        "ampere",
    ),
    (
        "torch with no wheel",
        machine(torch="2.13.0+cu130"),
        "your torch is 2.13; wheels for linux/cp312 exist for torch 2.12 and 2.14",
        "hopper_214_312",
    ),
    ("CPU-only torch", machine(torch="2.12.0+cpu", torch_cuda=None), "CPU-only build", "t4_linux"),
    (  # it said "a CPU-only build"
        "ROCm torch",
        machine(torch="2.12.0+rocm6.2", torch_cuda=None),
        "your torch 2.12.0+rocm6.2 is a ROCm (AMD GPU) build, which no wheel serves; the wheels "
        "for it need a torch built with CUDA 13.0",
        "t4_linux",
    ),
    (
        "torch built with another CUDA",
        machine(torch="2.12.0+cu128", torch_cuda="12.8"),
        "built with CUDA 12.8; the wheels for it need a torch built with CUDA 13.0",
        "t4_linux",
    ),
    (
        "torch not installed",
        machine(torch=None, torch_cuda=None),
        "torch is not installed",
        "t4_linux",
    ),
    (
        "python without wheels on windows",
        machine(os="windows", arch="amd64", python="3.11", glibc=None),
        "no wheel for CPython 3.11 on windows; wheels exist for cp312",
        "t4_win",
    ),
    ("linux arm64", machine(arch="aarch64"), "no wheel for linux aarch64", "t4_linux"),
    (
        "glibc too old for manylinux_2_28",
        machine(glibc="2.17"),
        "no wheel for linux x86_64 (glibc 2.17)",
        "t4_linux",
    ),
    (
        "macOS",
        machine(os="macos", arch="arm64", glibc=None),
        "wheels exist for: manylinux_2_28_x86_64, win_amd64",
        "t4_win",
    ),
]


@pytest.mark.parametrize("case,env,words,near", NONE_FITS, ids=[c[0] for c in NONE_FITS])
def test_none_fits_says_why_and_lists_nearest(case, env, words, near):
    verdict = pick_wheel.choose(MANIFEST, pick_wheel.machine_from_json(env))
    assert verdict.wheel is None
    assert words in verdict.reason
    assert WHEELS[near]["filename"] in [w["filename"] for w in verdict.nearest]


def test_windows_machine_never_gets_a_linux_wheel_and_back():
    for env, banned in (
        (machine(os="windows", arch="amd64", glibc=None), "linux"),
        (machine(), "win_amd64"),
    ):
        verdict = pick_wheel.choose(MANIFEST, pick_wheel.machine_from_json(env))
        assert banned not in verdict.wheel["filename"]


def test_arch_specific_target_runs_only_on_that_gpu():
    w = _wheel("sm90a.torch2.12cu130", "cp312", LINUX, ["sm90"], "2.12.0")
    w["gpu_targets"][0]["arch_specific"] = True
    assert pick_wheel.gpu_execution(w, (9, 0))[1].startswith("native")
    assert pick_wheel.gpu_execution(w, (9, 1)) is None


def test_ptx_runs_only_where_its_target_serves():
    w = WHEELS["ada_ptx"]
    assert pick_wheel.gpu_execution(w, (8, 9))[1] == "native sm89+PTX code"
    assert "PTX compiled by the driver" in pick_wheel.gpu_execution(w, (9, 0))[1]
    assert pick_wheel.gpu_execution(w, (10, 0)) is None
    assert pick_wheel.gpu_execution(w, (12, 0)) is None
    # absent (a manifest written before the field) or null: every newer GPU, as before
    legacy = {**w, "gpu_targets": [{k: v for k, v in w["gpu_targets"][0].items() if k != "ptx_serves"}]}
    assert "PTX" in pick_wheel.gpu_execution(legacy, (12, 0))[1]


def test_manifest_ptx_serves_must_be_a_list_of_capabilities():
    for bad, words in (("9.0", "ptx_serves must be null or a list"), (["nine"], "ptx_serves")):
        target = {**WHEELS["ada_ptx"]["gpu_targets"][0], "ptx_serves": bad}
        manifest = {**MANIFEST, "wheels": [{**WHEELS["ada_ptx"], "gpu_targets": [target]}]}
        with pytest.raises(pick_wheel.BadInput, match=words):
            pick_wheel.validate_manifest(manifest)


def test_manylinux_legacy_and_abi3_tags():
    m = pick_wheel.machine_from_json(machine(glibc="2.17"))
    assert pick_wheel.platform_fits("manylinux2014_x86_64", m)
    assert not pick_wheel.platform_fits("manylinux_2_28_x86_64", m)
    assert pick_wheel.python_fits("cp39", "abi3", m)
    assert not pick_wheel.python_fits("cp313", "abi3", m)
    assert not pick_wheel.python_fits("cp312", "cp312t", m)
    free = pick_wheel.machine_from_json({**machine(), "free_threaded": True})
    assert pick_wheel.python_fits("cp312", "cp312t", free)
    assert not pick_wheel.python_fits("cp312", "cp312", free)


# ---------------------------------------------------------------- CLI


def _run(
    tmp_path: Path, manifest, env, *extra: str, python_flags=()
) -> subprocess.CompletedProcess:
    mpath = tmp_path / "manifest.json"
    mpath.write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    epath = tmp_path / "env.json"
    epath.write_text(env if isinstance(env, str) else json.dumps(env))
    return subprocess.run(
        [
            sys.executable,
            *python_flags,
            str(PICKER),
            "--manifest",
            str(mpath),
            "--env-json",
            str(epath),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_found_prints_wheel_and_pip_uv_index_commands(tmp_path):
    # -S -I: no site-packages at all, which proves the picker needs only the standard library.
    res = _run(tmp_path, MANIFEST, machine(), python_flags=("-S", "-I"))
    assert res.returncode == pick_wheel.EXIT_FOUND, res.stderr
    name = WHEELS["t4_linux"]["filename"]
    assert name in res.stdout
    wheel_path = str(tmp_path / name)
    assert f'python -m pip install "{wheel_path}"' in res.stdout
    assert f'uv pip install "{wheel_path}"' in res.stdout
    assert (
        "--index-url https://example.invalid/simple/sm75.torch2.12cu130/ "
        '"sageattention==2.2.0+sm75.torch2.12cu130"'
    ) in res.stdout



def test_cli_says_a_ptx_jit_validation_checks_the_code_path_not_the_users_gpu(tmp_path):
    wheel = {**WHEELS["t4_linux"], "validation": {"status": "passed", "gpu_name": "NVIDIA H100", "compute_capability": "9.0",
                                                  "execution": "ptx-jit", "checks_passed": 24,
                                                  "checks_failed": 0, "checks_skipped": 1}}
    res = _run(tmp_path, {**MANIFEST, "wheels": [wheel]}, machine())
    assert res.returncode == pick_wheel.EXIT_FOUND, res.stderr
    assert "validated on NVIDIA H100 (compute capability 9.0, ptx-jit): 24 checks passed, 1 skipped" \
        in res.stdout
    assert "not the hardware its SASS is for" in res.stdout
    native = _run(tmp_path, MANIFEST, machine(gpus=[("H100", "9.0")]))
    assert "3 checks passed\n" in native.stdout and "PTX JIT" not in native.stdout

def test_cli_json_and_none_fits_exit_code(tmp_path):
    res = _run(tmp_path, MANIFEST, machine(torch="2.13.0+cu130"), "--json")
    assert res.returncode == pick_wheel.EXIT_NONE_FITS
    out = json.loads(res.stdout)
    assert out["status"] == "none-fits"
    assert "2.12 and 2.14" in out["reason"]
    assert out["wheel"] is None and out["nearest"]


@pytest.mark.parametrize(
    "manifest,env,message",
    [
        ("{not json", machine(), "is not JSON"),
        ({**MANIFEST, "schema_version": 99}, machine(), "schema_version 99 is not supported"),
        ({**MANIFEST, "wheels": [{"filename": "x.whl"}]}, machine(), "wheels[0] lacks"),
        (MANIFEST, {"os": "linux"}, "missing 'arch'"),
        (MANIFEST, {**machine(), "gpu": []}, "unknown field(s) ['gpu']"),
        (MANIFEST, machine(os="solaris"), "expected linux, windows or macos"),
        (
            {**MANIFEST, "wheels": [{**WHEELS["ada"], "gpu_targets": 5}]},
            machine(),
            "wheels[0].gpu_targets must be a non-empty list",
        ),
        (
            {**MANIFEST, "wheels": [{**WHEELS["ada"], "url": 5}]},
            machine(),
            "wheels[0].url must be a non-empty string",
        ),
        ({**MANIFEST, "index": "x"}, machine(), "'index' must be an object"),
        (
            {**MANIFEST, "wheels": [{**WHEELS["ada"], "validation": "x"}]},
            machine(),
            "wheels[0].validation must be an object",
        ),
        (MANIFEST, machine(gpus=[("T4", ["a", "b"])]), "expected a compute capability like"),
        (MANIFEST, machine(gpus=[("T4", [7.5, 0])]), "got [7.5, 0]"),
        (MANIFEST, machine(gpus=[("T4", "75")]), "expected a compute capability like '8.9'"),
        (MANIFEST, {**machine(), "free_threaded": "false"}, "free_threaded must be true or"),
        (MANIFEST, {**machine(), "python": 3.10}, "python must be a string such as '3.12'"),
        (MANIFEST, {**machine(), "torch": 2.12}, "torch must be a string such as"),
        # a TypeError traceback, then a dict read as a list of its keys
        (MANIFEST, {**machine(), "gpus": 5}, "--env-json: gpus must be a list like [{"),
        (MANIFEST, {**machine(), "gpus": {"name": "T4", "compute_capability": "7.5"}},
         "--env-json: gpus must be a list like [{"),
    ],
    ids=["not-json", "schema", "wheel-fields", "env-missing", "env-unknown", "env-os",
         "targets-not-list", "url-not-string", "index-not-object", "validation-not-object",
         "cc-not-numbers", "cc-float-list", "cc-no-dot", "free-threaded-string",
         "python-number", "torch-number", "gpus-number", "gpus-object"],
)
def test_cli_bad_input_exit_code(tmp_path, manifest, env, message):
    res = _run(tmp_path, manifest, env)
    assert res.returncode == pick_wheel.EXIT_BAD_INPUT
    assert message in res.stderr


def test_an_env_json_that_is_not_utf8_is_bad_input(tmp_path, capsys):
    # It was a UnicodeDecodeError traceback.
    (tmp_path / "manifest.json").write_text(json.dumps(MANIFEST))
    (tmp_path / "env.json").write_bytes(b"\xff\xfe{}")
    rc = pick_wheel.main(["--manifest", str(tmp_path / "manifest.json"),
                          "--env-json", str(tmp_path / "env.json")])
    assert rc == pick_wheel.EXIT_BAD_INPUT
    assert f"error: cannot read --env-json {tmp_path / 'env.json'}: " in capsys.readouterr().err


def test_cli_missing_manifest_is_bad_input(tmp_path):
    res = subprocess.run(
        [sys.executable, str(PICKER), "--manifest", str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == pick_wheel.EXIT_BAD_INPUT
    assert "cannot read manifest" in res.stderr


def test_no_torch_with_env_json_is_refused_not_ignored(tmp_path):
    res = _run(tmp_path, MANIFEST, machine(), "--no-torch")
    assert res.returncode == pick_wheel.EXIT_BAD_INPUT
    assert "with --env-json nothing is inspected" in res.stderr


def test_a_malformed_manifest_url_is_bad_input():
    with pytest.raises(pick_wheel.BadInput, match="cannot read manifest https://exa mple"):
        pick_wheel.load_manifest("https://exa mple.com/manifest.json")
    with pytest.raises(pick_wheel.BadInput, match="cannot read manifest http://"):
        pick_wheel.load_manifest("http://[::1/manifest.json")


def test_manifest_from_file_url_resolves_relative_wheel_url(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(MANIFEST))
    manifest, base = pick_wheel.load_manifest((tmp_path / "manifest.json").as_uri())
    cmds = pick_wheel.install_commands(manifest, base, WHEELS["ada"])
    assert str(tmp_path / WHEELS["ada"]["filename"]) in cmds["pip"]


def test_https_manifest_gives_https_wheel_url():
    base = "https://github.com/o/r/releases/download/v2.2.0/manifest.json"
    cmds = pick_wheel.install_commands({"index": {}}, base, WHEELS["ada"])
    assert cmds["pip"] == (
        'python -m pip install "https://github.com/o/r/releases/download/v2.2.0/'
        'sageattention-2.2.0%2Bsm89.torch2.12cu130-cp312-cp312-manylinux_2_28_x86_64.whl"'
    )
    assert "pip_index" not in cmds  # no hosted index named in the manifest


def test_detect_this_machine_without_importing_torch():
    from importlib import metadata

    m = pick_wheel.detect_machine(use_torch=False)
    assert m.python == sys.version_info[:2]
    assert m.os in ("linux", "windows", "macos")
    try:
        installed = metadata.version("torch")
    except metadata.PackageNotFoundError:
        installed = None
    # read from torch/version.py (--no-torch said "not installed"), which carries the +cuXYZ
    # label that the distribution's metadata may lack
    from packaging.version import Version
    assert (m.torch and Version(m.torch).public) == (installed and Version(installed).public)


def _fake_torch_env(tmp_path: Path, version: str, cuda: str | None, init: str) -> dict:
    """An environment whose `torch` is a stub package (version.py as torch writes it, __init__.py
    = ``init``) and whose nvidia-smi lists one H100; for the picker run as a subprocess."""
    pkg = tmp_path / "stub" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "version.py").write_text(
        "from typing import Optional\n"
        f"__version__ = {version!r}\ndebug = False\ncuda: Optional[str] = {cuda!r}\n")
    (pkg / "__init__.py").write_text(init)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 9.0'\n")
    smi.chmod(0o755)
    import os
    return {**os.environ, "PYTHONPATH": str(tmp_path / "stub"),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def _pick_here(tmp_path: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    mpath = tmp_path / "manifest.json"
    mpath.write_text(json.dumps(MANIFEST))
    return subprocess.run([sys.executable, str(PICKER), "--manifest", str(mpath), "--json", *extra],
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.skipif(sys.platform == "win32", reason="a shell-script nvidia-smi stub")
def test_no_torch_reads_torchs_version_without_importing_it(tmp_path):
    # --no-torch used to count torch as not installed, so it never found a wheel
    env = _fake_torch_env(tmp_path, "2.14.1+cu130", "13.0",
                          "raise RuntimeError('imported, but --no-torch must not import torch')\n")
    res = _pick_here(tmp_path, env, "--no-torch")
    answer = json.loads(res.stdout)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert (answer["machine"]["torch"], answer["machine"]["torch_cuda"]) == ("2.14.1+cu130", "13.0")
    assert answer["wheel"]["filename"] == WHEELS["hopper_214_311"]["filename"]
    assert not any("importing torch failed" in n for n in answer["machine"]["notes"])


@pytest.mark.skipif(sys.platform == "win32", reason="a shell-script nvidia-smi stub")
def test_a_cuda_torch_that_cannot_use_the_gpu_nvidia_smi_lists_is_said(tmp_path):
    # torch 2.12+cu130 under a driver too old for CUDA 13: is_available() is False; the picker
    # took the GPU from nvidia-smi and answered as if all were well
    stub = ("__version__ = '2.14.1+cu130'\n"
            "class version:\n    cuda = '13.0'\n"
            "class cuda:\n    @staticmethod\n    def is_available():\n        return False\n")
    env = _fake_torch_env(tmp_path, "2.14.1+cu130", "13.0", stub)
    res = _pick_here(tmp_path, env)
    answer = json.loads(res.stdout)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert answer["wheel"]["filename"] == WHEELS["hopper_214_311"]["filename"]
    note = " ".join(answer["machine"]["notes"])
    assert "torch 2.14.1+cu130 (CUDA 13.0) cannot use the 1 GPU(s) nvidia-smi lists" in note
    assert "driver may be too old for CUDA 13.0" in note


@pytest.mark.parametrize("torch", ["2.12.0.dev20261101+cu130", "2.12.0a0+git5c48869", "2.12.0rc2"])
def test_a_prerelease_or_source_torch_gets_the_wheel_with_a_caution(torch):
    verdict = pick_wheel.choose(MANIFEST, pick_wheel.machine_from_json(
        machine(torch=torch, gpus=[("H100", "9.0")])))
    assert verdict.wheel["filename"] == WHEELS["hopper_212"]["filename"]
    (caution,) = verdict.cautions
    assert f"your torch {torch} is a pre-release, nightly or source build" in caution
    assert "torch 2.12 release" in caution
    text = pick_wheel.render_text(pick_wheel.machine_from_json(machine(torch=torch)), verdict,
                                  {"pip": "p", "uv": "u"})
    assert "caution: your torch" in text


def test_a_release_torch_gets_no_caution():
    for torch in ("2.12.0+cu130", "2.12.1", "2.12.0.post1+cu130"):
        verdict = pick_wheel.choose(MANIFEST, pick_wheel.machine_from_json(
            machine(torch=torch, gpus=[("H100", "9.0")])))
        assert verdict.wheel is not None and verdict.cautions == [], torch


def test_help_mentions_exit_codes():
    res = subprocess.run(
        [sys.executable, str(PICKER), "--help"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0
    assert "exit codes" in res.stdout and "--env-json" in res.stdout


def test_manifest_over_http_gives_http_wheel_url(tmp_path):
    """A manifest URL (here a local HTTP server) makes the wheel URL relative to it."""
    import functools
    import http.server
    import threading

    (tmp_path / "manifest.json").write_text(json.dumps(MANIFEST))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/manifest.json"
        manifest, base = pick_wheel.load_manifest(url)
        with pytest.raises(pick_wheel.BadInput, match="cannot read manifest"):
            pick_wheel.load_manifest(url.replace("manifest.json", "missing.json"))
    finally:
        server.shutdown()
        thread.join()
    cmds = pick_wheel.install_commands(manifest, base, WHEELS["ada"])
    assert cmds["pip"].startswith(f'python -m pip install "http://127.0.0.1:{server.server_port}/')


# ---------------------------------------------------------------- libc, free-threading, torch's CUDA

MUSL = _wheel("sm75.torch2.12cu130", "cp312", "musllinux_1_2_x86_64", ["sm75+PTX"], "2.12.0")


def test_a_musl_linux_never_gets_a_manylinux_wheel():
    alpine = {**machine(glibc=None), "musl": "1.2"}
    verdict = pick_wheel.choose(MANIFEST, pick_wheel.machine_from_json(alpine))
    assert verdict.wheel is None
    assert "no wheel for linux x86_64 (musl 1.2)" in verdict.reason
    with_musl = {**MANIFEST, "wheels": [*MANIFEST["wheels"], MUSL]}
    verdict = pick_wheel.choose(with_musl, pick_wheel.machine_from_json(alpine))
    assert verdict.wheel["filename"] == MUSL["filename"]
    old = pick_wheel.machine_from_json({**alpine, "musl": "1.1"})
    assert not pick_wheel.platform_fits("musllinux_1_2_x86_64", old)
    glibc = pick_wheel.machine_from_json(machine())
    assert not pick_wheel.platform_fits("musllinux_1_2_x86_64", glibc)


def test_a_musl_linux_never_gets_an_unrepaired_linux_wheel():
    # linux_x86_64 (not repaired by auditwheel) fitted every Linux; ours are built against glibc.
    unrepaired = _wheel("sm75.torch2.12cu130", "cp312", "linux_x86_64", ["sm75+PTX"], "2.12.0")
    manifest = {**MANIFEST, "wheels": [unrepaired]}
    alpine = pick_wheel.machine_from_json({**machine(glibc=None), "musl": "1.2"})
    verdict = pick_wheel.choose(manifest, alpine)
    assert verdict.wheel is None
    assert "no wheel for linux x86_64 (musl 1.2); wheels exist for: linux_x86_64" in verdict.reason
    for glibc in ("2.35", None):  # glibc, or a C library the picker could not tell
        m = pick_wheel.machine_from_json(machine(glibc=glibc))
        assert pick_wheel.choose(manifest, m).wheel is unrepaired


def test_this_machine_on_musl_is_described_as_musl(monkeypatch):
    monkeypatch.setattr(pick_wheel.platform, "libc_ver", lambda: ("", ""))
    monkeypatch.setattr(pick_wheel, "_musl_version", lambda: (1, 2))
    monkeypatch.setattr(pick_wheel.sys, "platform", "linux")
    m = pick_wheel.detect_machine(use_torch=False)
    assert m.musl == (1, 2) and m.glibc is None
    assert not pick_wheel.platform_fits(f"manylinux_2_28_{m.arch}", m)


def test_python_3_13t_is_the_free_threaded_build():
    wheels = {
        "cp313": _wheel("sm75.torch2.12cu130", "cp313", LINUX, ["sm75+PTX"], "2.12.0"),
        "cp313t": {
            **_wheel("sm75.torch2.12cu130", "cp313", LINUX, ["sm75+PTX"], "2.12.0"),
            "filename": "sageattention-2.2.0+sm75.torch2.12cu130-cp313-cp313t-"
            "manylinux_2_28_x86_64.whl",
            "tags": ["cp313-cp313t-manylinux_2_28_x86_64"],
        },
    }
    manifest = {**MANIFEST, "wheels": list(wheels.values())}
    m = pick_wheel.machine_from_json(machine(python="3.13t"))
    assert m.free_threaded
    assert pick_wheel.choose(manifest, m).wheel is wheels["cp313t"]
    plain = pick_wheel.machine_from_json(machine(python="3.13"))
    assert pick_wheel.choose(manifest, plain).wheel is wheels["cp313"]


@pytest.mark.parametrize("torch, expected", [
    ("2.12.0+cu130", "13.0"), ("2.11.0+cu128", "12.8"), ("2.12.0+cpu", None),
    ("2.12.0+rocm6.2", None),
])
def test_torch_cuda_left_out_is_read_from_torchs_label(torch, expected):
    env = machine(torch=torch)
    del env["torch_cuda"]
    assert pick_wheel.machine_from_json(env).torch_cuda == expected


@pytest.mark.parametrize("env, message", [
    ({k: v for k, v in machine(torch="2.12.0").items() if k != "torch_cuda"},
     "torch_cuda is missing and torch '2.12.0' does not say its CUDA"),
    (machine(torch="2.12.0+cu130", torch_cuda="12.8"),
     "torch '2.12.0+cu130' and torch_cuda '12.8' disagree"),
    (machine(torch="2.12.0+cu130", torch_cuda=None),
     "torch '2.12.0+cu130' and torch_cuda None disagree"),
    (machine(torch="2.12.0+cpu", torch_cuda="13.0"),
     "torch '2.12.0+cpu' and torch_cuda '13.0' disagree"),
    (machine(torch="2.12.0+rocm6.2", torch_cuda="13.0"),
     "torch '2.12.0+rocm6.2' and torch_cuda '13.0' disagree"),
    ({**machine(python="3.13t"), "free_threaded": False}, "is a free-threaded build, but"),
    (machine(os="windows", arch="amd64", glibc="2.35"), "glibc describes a Linux machine"),
    ({**machine(), "musl": "1.2"}, "glibc and musl both given"),
    (machine(torch_cuda="13"), "torch_cuda must look like '13.0', got '13'"),
])
def test_env_json_that_contradicts_itself_is_refused(env, message):
    with pytest.raises(pick_wheel.BadInput, match=re.escape(message)):
        pick_wheel.machine_from_json(env)


def test_a_rocm_torch_is_described_as_rocm_not_cpu_only():
    m = pick_wheel.machine_from_json(machine(torch="2.12.0+rocm6.2", torch_cuda=None, gpus=[]))
    assert "torch 2.12.0+rocm6.2 (ROCm build)" in m.describe()
    assert "CPU-only" not in m.describe()
