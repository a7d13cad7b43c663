"""scripts/pick_wheel.py loaded as the module `pick_wheel` (a standalone script, not in a package),
once for every test file that calls it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PICKER = Path(__file__).resolve().parents[2] / "scripts" / "pick_wheel.py"

if "pick_wheel" in sys.modules:
    pick_wheel = sys.modules["pick_wheel"]
else:
    _spec = importlib.util.spec_from_file_location("pick_wheel", PICKER)
    pick_wheel = importlib.util.module_from_spec(_spec)
    sys.modules["pick_wheel"] = pick_wheel   # dataclasses look their module up while it runs
    _spec.loader.exec_module(pick_wheel)
