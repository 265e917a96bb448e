"""The draft length of speculative decoding (engine/draft_length.py) against simulated verify
steps: drafts accepted independently with probability alpha until the first rejection."""

from __future__ import annotations

import random

import pytest

from wick.engine.draft_length import AcceptanceEstimate, best_draft_length, expected_tokens


def simulate_step(rng: random.Random, alpha: float, k: int) -> int:
    """Drafts a verify step keeps (then the target adds one token of its own)."""
    kept = 0
    while kept < k and rng.random() < alpha:
        kept += 1
    return kept


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7, 0.95, 1.0])
@pytest.mark.parametrize("k", [0, 1, 4, 8])
def test_expected_tokens_equal_simulated_steps(alpha, k):
    rng = random.Random(k)
    trials = 40000
    mean = sum(simulate_step(rng, alpha, k) + 1 for _ in range(trials)) / trials
    assert expected_tokens(alpha, k) == pytest.approx(mean, rel=0.02)


def test_the_length_chosen_is_the_fastest_and_never_slower_than_plain_decoding():
    for alpha in [i / 20 for i in range(21)]:
        for row_cost in (0.0, 0.05, 0.2, 0.4, 1.0):
            k = best_draft_length(alpha, 8, row_cost)
            rates = [sum(alpha ** i for i in range(j + 1)) / (1 + row_cost * j)
                     for j in range(9)]
            assert rates[k] >= max(rates) - 1e-9 and rates[k] >= 1.0
    assert best_draft_length(0.0, 8, 0.0) == 0  # nothing accepted: no drafts
    assert best_draft_length(0.9, 8, 0.05) == 8
    assert best_draft_length(0.3, 8, 0.4) == 0  # rows too dear for the acceptance


def test_the_estimate_follows_acceptance_and_retries_after_stopping():
    rng = random.Random(1)
    for alpha in (0.2, 0.8):
        est = AcceptanceEstimate()
        seen = []
        for _ in range(400):
            kept = simulate_step(rng, alpha, 4)
            est.update(4, kept)
            seen.append(est.alpha)
        assert sum(seen[100:]) / 300 == pytest.approx(alpha, abs=0.08)
    est = AcceptanceEstimate()
    for _ in range(20):
        est.update(6, 0)
    assert best_draft_length(est.alpha, 8, 0.4) == 0
    steps = 0
    while best_draft_length(est.alpha, 8, 0.4) == 0:
        est.update(0, 0)  # steps without drafts
        steps += 1
    assert 2 <= steps <= 30
    with pytest.raises(ValueError):
        est.update(2, 3)


def test_the_row_cost_is_learned_from_step_times():
    from wick.engine.draft_length import StepCost

    cost = StepCost(prior=0.4)
    assert cost.row_cost == 0.4
    for _ in range(50):
        cost.record(1, 0.010)
    assert cost.row_cost == 0.4  # no wider step seen yet
    for _ in range(200):  # 5 rows cost 1.4x one row: each extra row 0.1 of a step
        cost.record(5, 0.014)
    assert abs(cost.row_cost - 0.1) < 0.01


def test_the_row_cost_without_one_row_steps():
    """Under speculation every step may verify (2 rows or more): the one-row time and the
    row cost come from the line through the wider steps."""
    from wick.engine.draft_length import StepCost

    cost = StepCost(prior=0.4)
    cost.record(3, 0.014)
    cost.record(3, 0.014)
    assert cost.row_cost == 0.4 and cost.one_row_seconds is None
    cost.record(2, 0.5)  # a cold first step of a width counts for nothing
    for rows in (2, 3, 5, 9):  # 10 ms + 2 ms per further row
        cost.record(rows, 0.010 + 0.002 * (rows - 1))
    for _ in range(200):
        for rows in (2, 3, 5, 9):
            cost.record(rows, 0.010 + 0.002 * (rows - 1))
    assert abs(cost.one_row_seconds - 0.010) < 1e-4
    assert abs(cost.row_cost - 0.2) < 0.01


def test_a_sequence_that_stopped_drafting_for_cost_probes_one_draft_now_and_then():
    """Where drafts do not pay (rows measured dear), a sequence drafts nothing, but one draft
    every PROBE_EVERY steps, so that what it costs is measured again (a single slow step on a
    busy machine must not stop speculation for good); drafting resumes once it pays."""
    from wick.engine.speculative import PROBE_EVERY, SequenceDrafter

    drafter = SequenceDrafter(max_tokens=8, ngram=True)
    lengths = [drafter.draft_length(100, row_cost=2.0) for _ in range(3 * PROBE_EVERY)]
    assert lengths == ([0] * (PROBE_EVERY - 1) + [1]) * 3
    for _ in range(PROBE_EVERY - 1):
        drafter.draft_length(100, row_cost=2.0)
    assert drafter.draft_length(0, row_cost=2.0) == 0  # no room: the probe waits for room
    assert drafter.draft_length(100, row_cost=2.0) == 1
    assert drafter.draft_length(100, row_cost=0.05) > 1  # cheap rows: drafting pays again
