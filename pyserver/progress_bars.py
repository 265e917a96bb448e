"""Progress of long work (compile, download, upload) in the CLI: one tqdm bar per stage on
stderr, plain lines where stderr is not a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def human_bytes(n: int) -> str:
    """``n`` bytes in B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


class ProgressBars:
    """``progress(stage, done, total)`` callback: one bar per stage on a terminal, one plain
    line per finished stage otherwise (logs, pipes, tests).

    Stages counted in bytes (``extract``, ``upload weights``) get byte units. A bar left before
    its stage completes (``resolve source`` wraps the download) is cleared, not left half-full;
    it draws again when that stage reports again.
    """

    BYTE_STAGES = frozenset({"extract", "upload weights"})
    UNITS = {"dequantize": "tensor", "read": "tensor", "write weights": "tensor"}

    def __init__(self, file: TextIO | None = None, *, bars: bool | None = None,
                 prefix: str = "") -> None:
        self.file = file or sys.stderr
        self.bars = self.file.isatty() if bars is None else bars
        self.prefix = f"{prefix}: " if prefix else ""  # names the work when several run
        self._stage: str | None = None
        self._started = 0.0
        self._bar = None  # tqdm, in bar mode

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage == "cached":
            self.close()
            print(f"{self.prefix}using the cached artifact (--force rebuilds it)", file=self.file,
                  flush=True)
            return
        if stage != self._stage:
            self._open(stage, total)
        if self._bar is not None:
            if self._bar.total != total:
                self._bar.total = total
            self._bar.update(done - self._bar.n)
        if total and done >= total:
            self._finish(stage, done, total)

    def _open(self, stage: str, total: int) -> None:
        self.close()
        self._stage = stage
        self._started = time.perf_counter()
        if self.bars:
            from tqdm import tqdm

            in_bytes = stage in self.BYTE_STAGES
            self._bar = tqdm(
                total=total, desc=self.prefix + stage, file=self.file, leave=False,
                dynamic_ncols=True,
                unit="B" if in_bytes else self.UNITS.get(stage, "step"),
                unit_scale=in_bytes, unit_divisor=1024 if in_bytes else 1000,
            )

    def _finish(self, stage: str, done: int, total: int) -> None:
        if self._bar is not None:
            self._bar.leave = True
            self._bar.close()
        else:
            amount = human_bytes(done) if stage in self.BYTE_STAGES else f"{done}/{total}"
            seconds = time.perf_counter() - self._started
            print(f"{self.prefix}{stage}: {amount} ({seconds:.1f} s)", file=self.file, flush=True)
        self._bar = None
        self._stage = None

    def close(self) -> None:
        """Clear an unfinished bar (call when the work is over or was interrupted)."""
        if self._bar is not None:
            self._bar.leave = False
            self._bar.close()
        self._bar = None
        self._stage = None
