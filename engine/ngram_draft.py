"""Prompt-lookup drafts (speculative decoding without a second model, issue #28): the tokens
that followed an earlier occurrence of the text's last n-gram are guessed to follow again. Pays
where output copies its input: code edits, quoting, extraction, rewriting.

The rule is prompt-lookup decoding's as transformers implements it
(``PromptLookupCandidateGenerator``, tested against it): the longest n-gram first (``max_n``
down to 1), its leftmost earlier occurrence with a continuation, at most ``k`` tokens of that
continuation, cut before a stop token (a drafted stop would end the sequence where the model
may not).

An index of every n-gram's start positions grows with the text and shrinks with it when a
verify step rejects drafted tokens, so a draft costs a few dict lookups, not a scan of the
whole text each step."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class NgramIndex:
    """The n-grams (1..``max_n`` tokens) of one sequence's tokens, by their start positions."""

    def __init__(self, max_n: int = 3, tokens: Iterable[int] = ()) -> None:
        if max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {max_n}")
        self.max_n = max_n
        self.tokens: list[int] = []
        self._starts: dict[tuple[int, ...], list[int]] = {}  # n-gram -> starts, increasing
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens (accepted ones, or the prompt)."""
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens)
            for n in range(1, min(self.max_n, end) + 1):
                gram = tuple(self.tokens[end - n:end])
                self._starts.setdefault(gram, []).append(end - n)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens (drafted ones the model rejected go)."""
        if not 0 <= length <= len(self.tokens):
            raise ValueError(f"cannot truncate {len(self.tokens)} tokens to {length}")
        while len(self.tokens) > length:
            end = len(self.tokens)
            for n in range(1, min(self.max_n, end) + 1):
                gram = tuple(self.tokens[end - n:end])
                starts = self._starts[gram]
                starts.pop()  # the latest start of each n-gram ending here is this one
                if not starts:
                    del self._starts[gram]
            self.tokens.pop()

    def draft(self, k: int, stop_ids: Sequence[int] = ()) -> list[int]:
        """At most ``k`` tokens guessed to come next (none when nothing matches)."""
        length = len(self.tokens)
        if k < 1 or length < 2:
            return []
        for n in range(min(self.max_n, length - 1), 0, -1):
            for start in self._starts.get(tuple(self.tokens[length - n:]), ()):
                follow = start + n
                if follow >= length:
                    break  # only the text's own suffix is left
                guess = self.tokens[follow:min(follow + k, length)]
                for i, token in enumerate(guess):
                    if token in stop_ids:
                        guess = guess[:i]
                        break
                if guess:
                    return guess
                # transformers takes its first match even when a stop token empties it
                return []
        return []
