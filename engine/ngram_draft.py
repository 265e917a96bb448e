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

    def starts(self, gram: Sequence[int]) -> list[int]:
        """Where ``gram`` (1..max_n tokens) starts in the text, increasing."""
        return self._starts.get(tuple(gram), [])

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


class PredictionDraft:
    """Drafts from a given text (OpenAI's predicted outputs: the document or code being
    edited). While the output follows the prediction, the prediction's next tokens are the
    draft; once it departs, the output's last n-gram (longest first, up to ``max_n``) is looked
    up in the prediction, the first occurrence past where the output last agreed preferred,
    and drafting continues after it (an edit changed a span, the rest is copied)."""

    def __init__(self, prediction: Sequence[int] | NgramIndex, max_n: int = 3) -> None:
        # an index may be shared by several drafts (a request's choices): it is only read
        self._index = (prediction if isinstance(prediction, NgramIndex)
                       else NgramIndex(max_n, prediction))
        self.tokens = self._index.tokens
        self.cursor: int | None = 0  # prediction tokens the output has followed; None: lost
        self._last = 0  # where it last agreed

    def advance(self, tokens: Iterable[int]) -> None:
        """The output grew by ``tokens``."""
        for token in tokens:
            if self.cursor is not None and self.cursor < len(self.tokens) and (
                    self.tokens[self.cursor] == token):
                self.cursor += 1
                self._last = self.cursor
            else:
                self.cursor = None

    def draft(self, output: Sequence[int], k: int, stop_ids: Sequence[int] = ()) -> list[int]:
        """At most ``k`` tokens of the prediction guessed to come next after ``output``."""
        if k < 1:
            return []
        if self.cursor is None:
            self.cursor = self._resync(output)
            if self.cursor is None:
                return []
        guess = self.tokens[self.cursor:self.cursor + k]
        for i, token in enumerate(guess):
            if token in stop_ids:
                return guess[:i]
        return guess

    def _resync(self, output: Sequence[int]) -> int | None:
        for n in range(min(self._index.max_n, len(output)), 0, -1):
            starts = self._index.starts(output[len(output) - n:])
            if not starts:
                continue
            # past where it last agreed: the token there is the one the output replaced
            ahead = [s for s in starts if self._last < s + n < len(self.tokens)]
            start = ahead[0] if ahead else starts[0]
            if start + n < len(self.tokens):
                return start + n
        return None
