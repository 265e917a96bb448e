"""How many tokens to draft for a sequence (speculative decoding, issue #28): enough to pay,
never so many that speculation makes the request slower than plain decoding.

Model: each drafted token is accepted with probability ``alpha``, independently, until the
first rejection; a verify step of ``k`` drafts then yields on average
``(1 - alpha^(k+1)) / (1 - alpha)`` tokens (the accepted drafts and the one the target samples
after them) and costs ``1 + row_cost * k`` plain steps, ``row_cost`` being what one more row
adds to a step (measured by the runner: near 0 where weights dominate on a GPU, 0.4 on today's
CPU kernels). The draft length maximizes tokens per cost; 0 when no length beats one token per
plain step.

``alpha`` is estimated per sequence from what its verify steps accepted, with older steps
weighing less (acceptance changes as the text moves from copying to writing).
"""

from __future__ import annotations

import statistics


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens a verify step of ``k`` drafts yields at per-draft acceptance ``alpha``."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_draft_length(alpha: float, max_k: int, row_cost: float) -> int:
    """The ``k`` in 0..``max_k`` with the most tokens per unit of step cost (ties: the
    shorter)."""
    best_k, best_rate = 0, 1.0
    for k in range(1, max_k + 1):
        rate = expected_tokens(alpha, k) / (1.0 + row_cost * k)
        if rate > best_rate * (1.0 + 1e-9):
            best_k, best_rate = k, rate
    return best_k


class AcceptanceEstimate:
    """Per-draft acceptance of one sequence, from its verify steps. A step that drafted ``k``
    and kept ``a`` saw ``a`` acceptances and, when ``a < k``, one rejection (drafts after the
    first rejection were never judged). Every step, old counts keep ``decay`` of their weight
    and the ``prior`` (worth ``prior_weight`` judged drafts) regains what they lost: a sequence
    that stopped drafting (alpha too low to pay) drifts back to the prior and tries again after
    a few steps, in case its text began to repeat."""

    def __init__(self, prior: float = 0.6, prior_weight: float = 2.0,
                 decay: float = 0.9) -> None:
        if not 0.0 <= prior <= 1.0 or prior_weight <= 0 or not 0.0 < decay < 1.0:
            raise ValueError("prior in [0, 1], prior_weight > 0, decay in (0, 1)")
        self._prior, self._weight, self._decay = prior, prior_weight, decay
        self._accepted = prior * prior_weight
        self._judged = prior_weight

    @property
    def alpha(self) -> float:
        return self._accepted / self._judged

    def update(self, drafted: int, accepted: int) -> None:
        """One step's outcome (``drafted`` 0: a step without drafts)."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted {accepted} of {drafted} drafts")
        regained = (1.0 - self._decay) * self._weight
        self._accepted = self._accepted * self._decay + regained * self._prior + accepted
        self._judged = (self._judged * self._decay + regained + accepted
                        + (1 if accepted < drafted else 0))


class StepCost:
    """What one more row adds to a decode step, as a fraction of a one-row step (the
    ``row_cost`` of ``best_draft_length``), learned from the steps the engine runs: the mean
    time of steps of each row count (recent steps weigh more), and a line through them (least
    squares, one point per row count): its slope over its value at one row. Under speculation
    a sequence may never run a one-row step (every step verifies), so the one-row time is the
    line's too. ``prior`` holds until two row counts were seen."""

    def __init__(self, prior: float = 0.4, decay: float = 0.95, learn: bool = True) -> None:
        """``learn=False``: the row cost stays ``prior`` (draft lengths that do not depend on
        how busy the machine is: tests)."""
        self.prior = prior
        self._decay = decay
        self._learn = learn
        self._mean: dict[int, float] = {}  # rows -> mean seconds
        self._seen: set[int] = set()  # row counts whose first step ran

    def record(self, rows: int, seconds: float) -> None:
        if rows < 1 or seconds <= 0 or not self._learn:
            return
        if rows not in self._seen:
            # a row count's first step is cold (the backend prepares that shape's calls) and
            # can take 10x the next: kept, a width seldom used would look dear for good, and
            # the engine, drafting less, would never run it again to learn otherwise
            self._seen.add(rows)
            return
        old = self._mean.get(rows)
        self._mean[rows] = seconds if old is None else old * self._decay + seconds * (
            1 - self._decay)

    def _line(self) -> tuple[float, float] | None:
        """(seconds of a one-row step, seconds per further row), None before two row counts."""
        if len(self._mean) < 2:
            return None
        slope, intercept = statistics.linear_regression(list(self._mean),
                                                        list(self._mean.values()))
        return intercept + slope, slope

    @property
    def one_row_seconds(self) -> float | None:
        """The time of a one-row step: measured, else the line's (None before either)."""
        one = self._mean.get(1)
        if one is not None:
            return one
        line = self._line()
        return line[0] if line is not None and line[0] > 0 else None

    @property
    def row_cost(self) -> float:
        line = self._line()
        if line is None or line[0] <= 0:
            return self.prior
        return min(2.0, max(0.0, line[1] / line[0]))
