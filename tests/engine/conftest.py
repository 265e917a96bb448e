"""Makes ``wick.engine`` importable from a plain checkout (before, or with a stale,
``pip install -e .``)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _map_engine_package() -> None:
    try:
        import wick.engine

        if getattr(wick.engine, "__file__", None):
            return  # installed (or already mapped) as a regular package
        # A stale editable install can map wick.engine as a namespace package: remap it.
        del sys.modules["wick.engine"]
    except ImportError:
        pass
    wick = sys.modules.get("wick")
    if wick is None:
        wick = types.ModuleType("wick")
        wick.__path__ = [str(ROOT / "wick")]
        sys.modules["wick"] = wick
    spec = importlib.util.spec_from_file_location(
        "wick.engine", ROOT / "engine" / "__init__.py",
        submodule_search_locations=[str(ROOT / "engine")],
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["wick.engine"] = module
    spec.loader.exec_module(module)
    wick.engine = module


_map_engine_package()
