"""wick as a Ray Serve LLM engine: ``LLMConfig(..., server_cls=WickServer)`` (pyserver/ray_llm.py;
docs/scale-out.md has the example)."""

from .server.ray_llm import WickEngine, WickServer

__all__ = ["WickEngine", "WickServer"]
