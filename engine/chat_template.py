"""Rendering a model's Jinja chat template, the way HF ``transformers`` does.

jinja2 is the one non-stdlib import in ``engine/``; it is imported lazily (a pure-Python wheel is
vendored in the browser). Settings match ``transformers``' ``_compile_jinja_template``: a sandboxed
environment, ``trim_blocks`` and ``lstrip_blocks``, a ``raise_exception`` global, ``tojson`` that
keeps non-ASCII text, and ``strftime_now``.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

from .errors import ArtifactError, InvalidRequestError


def render_chat_template(
    template: str | None,
    messages: list[dict[str, Any]],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    **extra: Any,
) -> str:
    """The prompt text for ``messages`` (dicts with ``role`` and ``content``)."""
    if not template:
        raise InvalidRequestError(
            "This model has no chat template, so it cannot serve chat completions; use the "
            "completions API with a prompt string instead.",
            param="messages",
            code="no_chat_template",
        )
    import jinja2.exceptions

    compiled = _compile(template)
    try:
        return compiled.render(
            messages=messages,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
            **extra,
        )
    except _TemplateRaised as e:
        # The template refused the conversation (e.g. "roles must alternate"): the user's fault.
        raise InvalidRequestError(str(e), param="messages", code="invalid_conversation") from e
    except jinja2.exceptions.TemplateError as e:
        raise InvalidRequestError(
            f"The model's chat template failed on these messages: {e}", param="messages",
            code="chat_template_error",
        ) from e


class _TemplateRaised(Exception):
    """``raise_exception(...)`` called from inside a template."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return time.strftime(fmt)


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    import jinja2.exceptions
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ArtifactError(f"the model's chat template does not parse: {e}") from e
