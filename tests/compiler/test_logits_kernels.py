"""The logit processing and logprobs kernels (compiler/logits.py) and min-p in ``sample_token``,
run on wgpu (lavapipe), against transformers' own LogitsProcessors and torch's log_softmax."""

from __future__ import annotations

import numpy as np
import pytest

from .kernel_harness import KernelRunner, compile_prim

from wick.compiler.logits import (  # noqa: E402
    LOGPROBS_PARAM_ORDER,
    MASKED,
    PROCESS_PARAM_ORDER,
    bitmask_words,
    logprobs_prim_func,
    process_logits_prim_func,
)
from wick.compiler.sampling import PARAM_ORDER, sampling_prim_func  # noqa: E402
from wick.engine.sequence import SamplingParams, logit_adjustments  # noqa: E402

torch = pytest.importorskip("torch")
generation = pytest.importorskip("transformers.generation.logits_process")


@pytest.fixture(scope="module", params=[1000, 49152])
def vocab(request):
    return request.param


@pytest.fixture(scope="module")
def process_kernel(vocab):
    return KernelRunner(compile_prim(process_logits_prim_func(vocab), PROCESS_PARAM_ORDER))


@pytest.fixture(scope="module")
def logprobs_kernel(vocab):
    return KernelRunner(compile_prim(logprobs_prim_func(vocab), LOGPROBS_PARAM_ORDER))


def _row_cases(V: int, rng):
    """(params, prompt ids, output ids, allowed-token bitmask or None) per row."""
    def ids(n):
        return [int(t) for t in rng.integers(0, V, n)]

    def mask():
        allowed = rng.random(V) < 0.3
        allowed[int(rng.integers(0, V))] = True
        return allowed

    bias = tuple(sorted({int(t): float(rng.uniform(-100, 100)) for t in ids(6)}.items()))
    return [
        (SamplingParams(), ids(5), ids(3), None),  # nothing: a plain copy
        (SamplingParams(repetition_penalty=1.3), ids(40), ids(25), None),
        (SamplingParams(frequency_penalty=0.5, presence_penalty=0.3), ids(10), ids(60), None),
        (SamplingParams(logit_bias=bias), ids(4), ids(4), None),
        (SamplingParams(), ids(4), ids(2), mask()),
        (SamplingParams(repetition_penalty=0.8, frequency_penalty=-0.4, presence_penalty=1.1,
                        logit_bias=bias), ids(30), ids(30), mask()),
    ]


def _pack(allowed: np.ndarray) -> np.ndarray:
    """xgrammar's layout: bit i % 32 of int32 word i // 32."""
    words = bitmask_words(allowed.size)
    padded = np.zeros(words * 32, bool)
    padded[: allowed.size] = allowed
    return np.packbits(padded.reshape(-1, 8), axis=1, bitorder="little").reshape(-1).view(
        np.int32)


def _reference(logits: np.ndarray, params: SamplingParams, prompt, output, allowed):
    """transformers' processors (repetition penalty over prompt + output, the bias as
    SequenceBiasLogitsProcessor), OpenAI's frequency/presence formula, the mask as -inf."""
    scores = torch.tensor(logits[None].astype(np.float64))
    seen = torch.tensor([prompt + output])
    if params.repetition_penalty != 1.0:
        scores = generation.RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(seen, scores)
    counts = np.bincount(output, minlength=logits.size)
    scores = scores - torch.tensor(params.frequency_penalty * counts
                                   + params.presence_penalty * (counts > 0))
    if params.logit_bias:
        proc = generation.SequenceBiasLogitsProcessor({(t,): b for t, b in params.logit_bias})
        scores = proc(seen, scores)
    out = scores[0].numpy()
    if allowed is not None:
        out = np.where(allowed, out, -np.inf)
    return out


def test_process_logits_matches_transformers(vocab, process_kernel):
    V = vocab
    rng = np.random.default_rng(V)
    cases = _row_cases(V, rng)
    b = len(cases)
    logits = (rng.standard_normal((b, V)) * 3).astype(np.float32)
    words = bitmask_words(V)
    mask = np.zeros((b, words), np.int32)
    mask_on = np.zeros(b, np.int32)
    indptr, tokens, rep, add = [0], [], [], []
    for r, (params, prompt, output, allowed) in enumerate(cases):
        counts: dict[int, int] = {}
        for t in output:
            counts[t] = counts.get(t, 0) + 1
        for t, f, a in logit_adjustments(params, frozenset(prompt), counts):
            tokens.append(t)
            rep.append(f)
            add.append(a)
        indptr.append(len(tokens))
        if allowed is not None:
            mask[r] = _pack(allowed)
            mask_on[r] = 1
    got = process_kernel.run({
        "logits": logits, "mask": mask, "mask_on": mask_on,
        "indptr": np.array(indptr, np.int32), "tokens": np.array(tokens, np.int32),
        "rep": np.array(rep, np.float32), "add": np.array(add, np.float32),
        "out": np.zeros((b, V), np.float32)}, {"b": b})["out"]
    np.testing.assert_array_equal(got[0], logits[0])
    for r, (params, prompt, output, allowed) in enumerate(cases):
        want = _reference(logits[r], params, prompt, output, allowed)
        masked = ~np.isfinite(want)
        np.testing.assert_array_equal(got[r] == np.float32(MASKED), masked, err_msg=f"row {r}")
        np.testing.assert_allclose(got[r][~masked], want[~masked], rtol=1e-6, atol=1e-4,
                                   err_msg=f"row {r}")
        assert r == 0 or (got[r] != logits[r]).any(), r  # every rule changed something


def test_logprobs_match_torch(vocab, logprobs_kernel):
    V = vocab
    rng = np.random.default_rng(3)
    b = 5
    logits = (rng.standard_normal((b, V)) * 4).astype(np.float32)
    logits[3, [11, 5, 700 % V]] = logits[3].max() + 2.0  # a three-way tie: ids ascending
    token = rng.integers(0, V, b).astype(np.int32)
    num_top = np.array([20, 0, 5, 3, -1], np.int32)
    out = logprobs_kernel.run({
        "logits": logits, "token": token, "num_top": num_top,
        "logprob": np.full((b, 21), 7.0, np.float32), "top_ids": np.full((b, 20), -7, np.int32)},
        {"b": b})
    ref = torch.log_softmax(torch.tensor(logits, dtype=torch.float64), dim=-1).numpy()
    for r in range(b):
        if num_top[r] < 0:
            assert (out["logprob"][r] == 7.0).all() and (out["top_ids"][r] == -7).all()
            continue
        assert abs(out["logprob"][r, 0] - ref[r, token[r]]) < 1e-4
        k = num_top[r]
        order = np.lexsort((np.arange(V), -logits[r]))[:k]  # value descending, then id
        np.testing.assert_array_equal(out["top_ids"][r, :k], order)
        np.testing.assert_allclose(out["logprob"][r, 1:k + 1], ref[r, order], atol=1e-4)
        values, _ = torch.topk(torch.tensor(ref[r]), k) if k else (torch.tensor([]), None)
        np.testing.assert_allclose(out["logprob"][r, 1:k + 1], values.numpy(), atol=1e-4)
    np.testing.assert_array_equal(out["top_ids"][3, :3], sorted([11, 5, 700 % V]))


def test_min_p_keeps_what_transformers_keeps(vocab):
    """min_p rows: u -> 0 and u -> 1 pick the first and last token MinPLogitsWarper keeps (after
    temperature); each uniform in between lands on a kept token."""
    V = vocab
    run = KernelRunner(compile_prim(sampling_prim_func(V), PARAM_ORDER))
    rng = np.random.default_rng(9)
    row = (rng.standard_normal(V) * 3).astype(np.float32)
    cases = [(0.05, 1.0), (0.2, 0.7), (0.5, 1.5), (0.01, 1.0)]
    rows = [(mp, t, u) for mp, t in cases for u in (0.0, 0.99999994, 0.37, 0.81)]
    b = len(rows)
    got = run.run({
        "logits": np.repeat(row[None], b, 0),
        "temperature": np.array([t for _, t, _ in rows], np.float32),
        "top_p": np.ones(b, np.float32), "top_k": np.zeros(b, np.int32),
        "min_p": np.array([mp for mp, _, _ in rows], np.float32),
        "uniform": np.array([u for _, _, u in rows], np.float32),
        "token": np.full(b, -1, np.int32)}, {"b": b})["token"]
    for (mp, t, u), token in zip(rows, got):
        scores = torch.tensor(row[None].astype(np.float64)) / t
        warped = generation.MinPLogitsWarper(mp)(None, scores)[0]
        kept = np.nonzero(np.isfinite(warped.numpy()))[0]
        assert 1 < kept.size < V, (mp, t)
        assert token in kept, (mp, t, u, token)
        if u == 0.0:
            assert token == kept[0]
        if u > 0.9999:
            assert token == kept[-1]
