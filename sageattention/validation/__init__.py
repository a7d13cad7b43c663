"""GPU validation suite, shipped inside the wheel so it runs against the wheel's own code.

    python -m sageattention.validation --help

Each check records pass, fail or skip with its reason, its error figures against fp32 SDPA and
the backend that actually ran. See docs/validation.md.
"""

from .catalog import CHECK_NAMES, CHECKS
from .suite import NoGpu, run_suite

__all__ = ["CHECKS", "CHECK_NAMES", "NoGpu", "run_suite"]
