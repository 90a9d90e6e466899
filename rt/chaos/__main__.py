"""``python -m rt.chaos``: the rt-chaos console script."""

from __future__ import annotations

import sys

from rt.chaos.cli import main

sys.exit(main())
