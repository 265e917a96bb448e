"""argparse types for numbers in a range. A value outside it is argparse's usage error, naming
the range (exit 2), before anything starts: not a server that binds, loads a model and then
fails every request (``--kv-cache-mib -5`` left one page of KV cache), nor a traceback."""

from __future__ import annotations

import argparse
import math
from typing import Callable


def number_in(kind: type, low: float, high: float | None = None, *,
              above: bool = False) -> Callable[[str], float]:
    """A parser of ``kind`` (int or float) from ``low`` (exclusive when ``above``) to ``high``
    (inclusive; None: no bound). Floats must be finite."""
    rule = (f"> {low:g}" if above else f">= {low:g}") if high is None else (
        f"in ({low:g}, {high:g}]" if above else f"in [{low:g}, {high:g}]")

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if (value <= low if above else value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    return parse


positive_int = number_in(int, 1)
