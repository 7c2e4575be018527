"""Where niah keeps what it can always rebuild: $NIAH_CACHE, default ~/.cache/niah.

    cache_root() -> Path

Users: the embedded server's converted weights (serving/embedded/weights.py) and the SGLang
contract's per-file scans (serving/sglang/contract/scan_cache.py). Nothing there is a result:
deleting the folder costs time only.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("NIAH_CACHE") or Path.home() / ".cache" / "niah")
