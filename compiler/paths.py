"""Where wick keeps what it downloads and builds.

``WICK_HOME`` wins; otherwise ``$XDG_CACHE_HOME/wick``, otherwise ``~/.cache/wick``. Nothing is
created on import: the helpers make their directory when called.
"""

from __future__ import annotations

import os
from pathlib import Path


def wick_home() -> Path:
    """The root of wick's cache (not created here)."""
    explicit = os.environ.get("WICK_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "wick"


def sources_dir() -> Path:
    """Model files fetched for built-in names: ``<home>/sources/<name>/``."""
    path = wick_home() / "sources"
    path.mkdir(parents=True, exist_ok=True)
    return path


def artifacts_dir() -> Path:
    """Compiled artifacts: ``<home>/artifacts/``."""
    path = wick_home() / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path
