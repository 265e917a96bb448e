"""wick: a browser-first LLM engine. ``from wick import Engine, AsyncEngine``."""

from ._version import __version__

__all__ = ["Engine", "AsyncEngine", "__version__"]


def __getattr__(name: str):
    # Lazy: importing wick must not import TVM, wgpu or numpy.
    if name in ("Engine", "AsyncEngine"):
        from .server import local

        return getattr(local, name)
    raise AttributeError(name)
