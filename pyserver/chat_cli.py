"""The REPL behind ``wick chat``: multi-turn history over ``engine.chat.completions.create``.

A model without a chat template (a base model) gets a completion REPL instead: the session is
one growing text that the model continues (``engine.completions.create``). A reasoning model's
thinking (``reasoning_content``) is shown dimmed and kept out of the history.

Lines are read from stdin (readline editing when it is a terminal; plain lines when piped).
A line starting with ``/`` is a command (``COMMANDS``); anything else is a user turn whose reply
streams to stdout and is appended to the history. Errors of one turn (a ``WickError``) are
printed as ``error: ...`` on stderr and the chat goes on.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..engine.errors import ContextLengthExceededError, InvalidRequestError, WickError
from ..engine.protocol import SamplingFields
from ..engine.sampling_defaults import INTERACTIVE, chat_values, describe

_DIM, _PLAIN = "\x1b[2m", "\x1b[0m"  # a terminal's dim text (reasoning), and back

# /set KEY=VALUE: the sampling fields a user may change, with their parsers
SETTABLE = {"temperature": float, "top_p": float, "top_k": int, "max_tokens": int, "seed": int}
COMMANDS = {
    "/help": "show this help",
    "/exit": "quit (also Ctrl-D)",
    "/reset": "clear the conversation history (the system prompt stays)",
    "/stats": "prefill/decode tokens/s of the last reply and host ms per decode step",
    "/set": "/set temperature=0.5;top_p=0.9;top_k=40;max_tokens=100;seed=1 (value 'none' "
            "restores the default)",
}


def parse_settings(text: str, current: dict[str, Any]) -> dict[str, Any]:
    """``"temperature=0.5;max_tokens=100"`` -> the new settings (``current`` updated), checked
    by the same validation the API applies to requests. Raises ``InvalidRequestError``."""
    new = dict(current)
    items = [item.strip() for item in text.split(";") if item.strip()]
    if not items:
        raise InvalidRequestError("usage: /set key=value;key=value (keys: "
                                  f"{', '.join(SETTABLE)})", code="invalid_value")
    for item in items:
        key, sep, raw = (part.strip() for part in item.partition("="))
        if key not in SETTABLE:
            raise InvalidRequestError(f"unknown setting '{key}'; settable: {', '.join(SETTABLE)}",
                                      param=key, code="invalid_value")
        if not sep or not raw:
            raise InvalidRequestError(f"'{key}' needs a value: /set {key}=VALUE", param=key,
                                      code="invalid_value")
        if raw.lower() in ("none", "default"):
            new.pop(key, None)
            continue
        try:
            new[key] = SETTABLE[key](raw)
        except ValueError:
            kind = "an integer" if SETTABLE[key] is int else "a number"
            raise InvalidRequestError(f"'{key}' must be {kind}, got '{raw}'", param=key,
                                      code="invalid_type") from None
    SamplingFields(**new)  # range checks; raises InvalidRequestError naming the parameter
    return new


@dataclass(slots=True)
class StepSample:
    """Host milliseconds of one decode step, split by who spent them."""

    engine_ms: float  # schedule + postprocess
    plan_ms: float  # runner: build inputs and dispatch lists
    backend_ms: float  # runner: encode + submit + wait + read back


@dataclass(slots=True)
class ChatSession:
    engine: Any  # wick.Engine (or any EngineAPI with a .core)
    sampling: dict[str, Any] = field(default_factory=dict)
    system: str | None = None
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    messages: list[dict[str, str]] = field(default_factory=list)
    steps: list[StepSample] = field(default_factory=list)  # decode steps seen in the last reply
    document: str = ""  # completion mode: the text so far, which the model continues

    def __post_init__(self) -> None:
        SamplingFields(**self.sampling)  # the API's range checks, before the first turn
        self.reset()

    @property
    def fallback(self) -> dict[str, Any]:
        """What a turn sends for the fields ``/set`` left unset: nothing where the model has
        sampling defaults of its own (the engine applies them), else Ollama's interactive
        ones (OpenAI's temperature 1 makes small models ramble)."""
        return chat_values(self.engine.core.info.sampling_defaults)

    @property
    def turn_sampling(self) -> dict[str, Any]:
        return {**self.fallback, **self.sampling}

    def defaults_text(self) -> str:
        own = self.engine.core.info.sampling_defaults
        if own:
            return f"sampling defaults: {describe(own)}"
        return ("sampling defaults: " + ", ".join(f"{k} {v:g}" for k, v in INTERACTIVE.items())
                + " (interactive: the model gives none)")

    @property
    def completion_mode(self) -> bool:
        """A base model (no chat template): each line extends a text the model continues."""
        return self.engine.core.info.chat_template is None

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.document = self.system + "\n" if self.system and self.completion_mode else ""

    # -- one line -------------------------------------------------------------------------------

    def handle(self, line: str) -> bool:
        """Run one input line; False when the chat should end."""
        line = line.strip()
        if not line:
            return True
        if not line.startswith("/"):
            self.ask(line)
            return True
        command, _, rest = line.partition(" ")
        if command in ("/exit", "/quit"):
            return False
        if command == "/help":
            for name, text in COMMANDS.items():
                self._say(f"  {name:<7} {text}")
        elif command == "/reset":
            self.reset()
            self._say("history cleared")
        elif command == "/stats":
            self._say(self.stats_text())
        elif command == "/set":
            try:
                self.sampling = parse_settings(rest, self.sampling)
            except WickError as e:
                self._error(e.message)
            else:
                shown = "; ".join(f"{k}={v}" for k, v in self.sampling.items()) or "defaults"
                self._say(f"sampling: {shown}")
        else:
            self._error(f"unknown command {command}; /help lists the commands")
        return True

    def ask(self, text: str) -> str:
        """Send one user turn; stream the reply to ``out``; keep both turns in the history."""
        prompt = self.document + text  # completion mode's prompt
        self.messages.append({"role": "user", "content": text})
        core = self.engine.core
        self.steps = []
        parts: list[str] = []
        stream = None
        thinking = False  # inside dimmed reasoning output
        try:
            if self.completion_mode:
                stream = self.engine.completions.create(prompt=prompt, stream=True,
                                                        **self.turn_sampling)
            else:
                stream = self.engine.chat.completions.create(
                    messages=self.messages, stream=True, **self.turn_sampling)
            seen = None  # core.stats.num_steps at the previous chunk; None until the first token
            for chunk in stream:
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                if self.completion_mode:
                    content, reasoning = choice.text, None
                else:
                    content, reasoning = choice.delta.content, choice.delta.reasoning_content
                if reasoning:
                    if not thinking:
                        self.out.write(_DIM if self._styled else "[thinking] ")
                        thinking = True
                    self.out.write(reasoning)
                    self.out.flush()
                if content and thinking:
                    self.out.write(_PLAIN if self._styled else "\n[answer] ")
                    thinking = False
                if content:
                    n = core.stats.num_steps
                    if seen is not None and n == seen + 1:  # exactly one (decode) step made it
                        t = core.runner.timings
                        self.steps.append(StepSample(core.stats.last_step_host_ms, t.plan_ms,
                                                     t.backend_ms))
                    seen = n
                    parts.append(content)
                    self.out.write(content)
                    self.out.flush()
        except KeyboardInterrupt:
            if stream is not None:
                stream.close()  # aborts the request; its pages are freed at the next step
            self.out.write((_PLAIN if thinking and self._styled else "") + "\n[stopped]")
        except WickError as e:
            self.messages.pop()
            self.out.write("\n" if parts else "")
            self.out.flush()
            too_long = isinstance(e, ContextLengthExceededError)
            self._error(e.message + (" (/reset clears the history)" if too_long else ""))
            return ""
        self.out.write((_PLAIN if thinking and self._styled else "") + "\n")
        self.out.flush()
        reply = "".join(parts)
        if reply:
            self.messages.append({"role": "assistant", "content": reply})
            if self.completion_mode:
                self.document = prompt + reply + "\n"
        else:
            self.messages.pop()  # nothing came back: forget the question too
        return reply

    @property
    def _styled(self) -> bool:
        return bool(getattr(self.out, "isatty", lambda: False)())

    def stats_text(self) -> str:
        last = self.engine.core.stats.last_request
        if last is None:
            return f"no finished reply yet; {self.defaults_text()}"
        lines = [self.defaults_text(),
            f"prefill: {last.prefill_tokens_per_s:.1f} tok/s ({last.prompt_tokens} tokens, "
            f"{last.cached_tokens} cached, {last.prefill_s * 1e3:.1f} ms)",
            f"decode:  {last.decode_tokens_per_s:.1f} tok/s ({last.completion_tokens} tokens, "
            f"{last.decode_s * 1e3:.1f} ms)",
        ]
        spec = self.engine.core.stats
        if spec.spec_verify_steps:
            lines.append(f"speculation: {spec.spec_acceptance_rate:.0%} of "
                         f"{spec.spec_drafted_tokens} drafted tokens accepted, "
                         f"{spec.spec_mean_accepted_length:.2f} tokens per verify step")
        if self.steps:
            n = len(self.steps)
            engine = sum(s.engine_ms for s in self.steps) / n
            plan = sum(s.plan_ms for s in self.steps) / n
            backend = sum(s.backend_ms for s in self.steps) / n
            lines.append(f"host ms per decode step (mean of {n}): engine {engine:.2f}, "
                         f"plan {plan:.2f}, backend {backend:.2f} (encode+submit+wait)")
        return "\n".join(lines)

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _error(self, text: str) -> None:
        self.out.flush()
        print(f"error: {text}", file=self.err, flush=True)


def run_repl(session: ChatSession, stdin: TextIO | None = None) -> int:
    """Read lines until /exit or end of input; returns the exit status (0)."""
    stdin = stdin or sys.stdin
    interactive = stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
    while True:
        try:
            if interactive:
                line = input(">>> ")
            else:
                line = stdin.readline()
                if not line:
                    break
        except EOFError:
            print(file=session.out)
            break
        except KeyboardInterrupt:
            print("\n(/exit or Ctrl-D quits)", file=session.out, flush=True)
            continue
        if not session.handle(line):
            break
    return 0
