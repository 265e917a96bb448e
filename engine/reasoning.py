"""Reasoning models (Qwen3, DeepSeek-R1 distills) think inside ``<think>...</think>`` before
they answer. The API returns the thinking as ``reasoning_content`` beside ``content``, in the
message and in stream deltas, as vLLM's reasoning parsers and DeepSeek's API do.

Rules:
- output that starts with the start tag thinks until the end tag: text up to it is reasoning,
  text after it content;
- a template may open the think block itself (the prompt ends in the start tag, as in
  Qwen3-Thinking): then the output is reasoning from its first token;
- any other output is all content (a model asked not to think, e.g. Qwen3 with
  ``enable_thinking: false``, whose template writes an empty think block into the prompt);
- a block never closed is all reasoning (the output ran out while thinking).
The whitespace the model puts between the end tag and its answer is dropped.

The parser is incremental: ``push`` takes text as it streams (a tag may arrive split across
pushes; a possible partial tag is held back) and returns the (reasoning, content) to emit now.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tools import partial_suffix

THINK_TAGS = ("<think>", "</think>")


def reasoning_tags(chat_template: str | None) -> tuple[str, str] | None:
    """The tags of a template that makes the model think (one that mentions both)."""
    if chat_template and all(tag in chat_template for tag in THINK_TAGS):
        return THINK_TAGS
    return None


@dataclass
class ReasoningParser:
    start: str = THINK_TAGS[0]
    end: str = THINK_TAGS[1]
    opened: bool = False  # the prompt already opened the think block

    def __post_init__(self) -> None:
        self._phase = "thinking" if self.opened else "begin"  # begin -> (thinking ->) answer
        self._held = ""  # text not yet emitted: a possible partial tag
        self._strip_lead = False  # drop whitespace right after the end tag

    def push(self, text: str) -> tuple[str, str]:
        """(reasoning, content) to emit for ``text``."""
        text = self._held + text
        self._held = ""
        reasoning = ""
        if self._phase == "begin":
            stripped = text.lstrip()
            if len(stripped) < len(self.start) and self.start.startswith(stripped):
                self._held = text  # too short yet to tell whether the start tag comes
                return "", ""
            if stripped.startswith(self.start):
                text, self._phase = stripped[len(self.start):], "thinking"
            else:
                self._phase = "answer"
        if self._phase == "thinking":
            at = text.find(self.end)
            if at < 0:
                keep = partial_suffix(text, self.end)
                self._held = text[len(text) - keep:]
                return text[:len(text) - keep], ""
            reasoning, text = text[:at], text[at + len(self.end):]
            self._phase, self._strip_lead = "answer", True
        if self._strip_lead:
            text = text.lstrip()
            self._strip_lead = not text
        return reasoning, text

    def finish(self) -> tuple[str, str]:
        """What is still held when the output ends."""
        held, self._held = self._held, ""
        if self._phase == "thinking":
            return held, ""
        return "", held
