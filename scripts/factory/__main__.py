"""``python -m scripts.factory``: see scripts/factory/cli.py."""

import sys

from .cli import main

sys.exit(main())
