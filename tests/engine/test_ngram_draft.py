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
