"""Where gclm keeps what it builds: converted models and compiled tables.

Below every package (like `gclm.errors`): the server's settings, the model loader and the
vLLM logits processor (in vLLM's engine-core processes) all read the default from here.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """$GCLM_CACHE_DIR, else `$XDG_CACHE_HOME/gclm`, else `~/.cache/gclm`: converted models
    and compiled tables live here."""
    configured = os.environ.get("GCLM_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gclm"
