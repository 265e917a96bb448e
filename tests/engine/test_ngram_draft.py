"""Prompt-lookup drafts equal transformers' PromptLookupCandidateGenerator on the same tokens,
as the text grows and as rejected drafts are cut off again."""

from __future__ import annotations

import random

import pytest

from wick.engine.ngram_draft import NgramIndex


def transformers_draft(tokens: list[int], k: int, max_n: int, stop_ids: list[int]) -> list[int]:
    import torch
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    gen = PromptLookupCandidateGenerator(
        eos_token_id=torch.tensor(stop_ids) if stop_ids else None, num_output_tokens=k,
        max_matching_ngram_size=max_n, max_length=10**9)
    ids = torch.tensor([tokens])
    candidates, _ = gen.get_candidates(ids)
    return candidates[0, len(tokens):].tolist()


def test_a_copy_is_drafted_from_its_source():
    source = [7, 8, 9, 10, 11, 12, 13]
    index = NgramIndex(3, [1, 2, *source, 3, 4, 7, 8])  # copying has begun: "7 8"
    assert index.draft(4) == [9, 10, 11, 12]
    assert index.draft(4, stop_ids=[11]) == [9, 10]
    assert NgramIndex(3, [1, 2, 3]).draft(4) == []  # nothing seen twice


@pytest.mark.parametrize("max_n", [1, 2, 3])
def test_drafts_equal_transformers_as_the_text_grows_and_shrinks(max_n):
    rng = random.Random(max_n)
    checked = drafted = 0
    for trial in range(40):
        vocab = rng.randint(2, 9)  # small vocabularies: many repeated n-grams
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(0, 30))]
        index = NgramIndex(max_n, tokens)
        for _ in range(12):
            k = rng.randint(1, 8)
            stops = rng.sample(range(vocab), rng.randint(0, 1))
            got = index.draft(k, stop_ids=stops)
            assert got == transformers_draft(tokens, k, max_n, stops), (tokens, k, stops)
            checked += 1
            drafted += bool(got)
            if rng.random() < 0.4 and tokens:  # a verify step rejected a tail
                cut = rng.randint(0, len(tokens))
                index.truncate(cut)
                del tokens[cut:]
            more = [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]
            index.extend(more)
            tokens += more
            assert index.tokens == tokens
    assert drafted > checked // 3  # the comparison covered drafts, not only empty ones


def test_truncation_restores_the_index_of_the_shorter_text():
    rng = random.Random(5)
    tokens = [rng.randrange(4) for _ in range(60)]
    index = NgramIndex(3, tokens)
    index.truncate(25)
    fresh = NgramIndex(3, tokens[:25])
    assert index._starts == fresh._starts
    with pytest.raises(ValueError):
        index.truncate(26)


def test_a_prediction_is_followed_then_found_again_after_an_edit():
    from wick.engine.ngram_draft import PredictionDraft

    pred = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    d = PredictionDraft(pred, max_n=2)
    assert d.draft([], 3) == [1, 2, 3]  # nothing written yet: the prediction's start
    d.advance([1, 2])
    assert d.draft([1, 2], 3) == [3, 4, 5]
    d.advance([40, 41])  # the output departs (an edit) ...
    assert d.draft([1, 2, 40, 41], 3) == []  # ... and nothing of it is in the prediction
    d.advance([5, 6])  # ... then rejoins: "5 6" is found, drafting continues after it
    assert d.draft([1, 2, 40, 41, 5, 6], 3) == [7, 8, 9]
    assert d.draft([1, 2, 40, 41, 5, 6], 3, stop_ids=[8]) == [7]
    d.advance([7, 8, 9, 10])
    assert d.draft([1, 2, 40, 41, 5, 6, 7, 8, 9, 10], 3) == []  # the prediction is used up


def test_a_repeated_ngram_resyncs_forward_of_where_the_output_last_agreed():
    from wick.engine.ngram_draft import PredictionDraft

    pred = [1, 9, 2, 3, 1, 9, 4, 5]
    d = PredictionDraft(pred, max_n=1)
    d.advance([1, 9, 2, 3, 7])  # followed up to 3, then departed
    assert d.draft([1, 9, 2, 3, 7, 1], 2) == [9, 4]  # the "1" after position 4, not the first
