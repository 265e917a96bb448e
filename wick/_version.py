"""wick's version, the one place it is written (pyproject.toml reads it; the compiler stamps it
on every artifact)."""

__version__ = "0.1.0"
