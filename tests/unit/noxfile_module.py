"""noxfile.py loaded once as the module `noxfile_under_test` (loading registers its sessions with
nox), and a stand-in for the session object its functions are called with. Shared by the test
files that call the noxfile's sessions directly."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

NOXFILE = Path(__file__).resolve().parents[2] / "noxfile.py"
NAME = "noxfile_under_test"


def load_noxfile():
    """The noxfile as a module (the test skipped where nox is not installed)."""
    pytest.importorskip("nox", reason="needs nox")
    if NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(NAME, NOXFILE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[NAME] = module
    return sys.modules[NAME]


class FakeSession:
    """What a nox session function uses: posargs, error, warn, install, run."""

    def __init__(self, *posargs):
        self.posargs, self.errors, self.warnings, self.runs = list(posargs), [], [], []

    def error(self, message):
        self.errors.append(message)
        raise SystemExit(message)  # nox's session.error aborts the session

    def warn(self, message):
        self.warnings.append(message)

    def install(self, *packages):
        pass

    def run(self, *command):
        self.runs.append(command)
