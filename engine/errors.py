"""Typed errors. Each says what went wrong and what to do about it.

Every error carries the four fields of OpenAI's error object (``message``, ``type``, ``param``,
``code``) plus the HTTP ``status`` the server answers with, so the same error reaches a REST
client, a Python caller and (rebuilt from ``to_dict()``) a JS caller with its type intact.
"""

from __future__ import annotations

from typing import Any, Iterable


class WickError(Exception):
    """Base of every error wick raises on purpose."""

    default_status = 500
    default_type = "internal_error"
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.type = type if type is not None else self.default_type
        self.status = status if status is not None else self.default_status

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(message={self.message!r}, param={self.param!r}, "
            f"code={self.code!r}, status={self.status})"
        )


class InvalidRequestError(WickError):
    """The request itself is wrong: a bad value, a missing field, an unknown field."""

    default_status = 400
    default_type = "invalid_request_error"


class UnsupportedParameterError(InvalidRequestError):
    """A known OpenAI parameter that wick does not implement (yet) was given a non-default value."""

    default_code = "unsupported_parameter"

    def __init__(self, param: str, message: str | None = None) -> None:
        super().__init__(
            message or f"Unsupported parameter: '{param}' is not supported by wick yet; remove it.",
            param=param,
        )


class ContextLengthExceededError(InvalidRequestError):
    """Prompt plus requested completion do not fit the model's context window (or the KV cache)."""

    default_code = "context_length_exceeded"

    def __init__(
        self,
        context_window: int,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        param: str = "messages",
        limit_name: str = "maximum context length",
    ) -> None:
        self.context_window = context_window
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        requested = prompt_tokens + completion_tokens
        where = "messages" if param == "messages" else "prompt"
        super().__init__(
            f"This model's {limit_name} is {context_window} tokens. However, you requested "
            f"{requested} tokens ({prompt_tokens} in the {where}, {completion_tokens} in the "
            f"completion). Please reduce the length of the {where} or completion.",
            param=param,
        )

    @classmethod
    def before_tokenizing(cls, message: str, *, context_window: int,
                          param: str) -> ContextLengthExceededError:
        """The request is too long on its face (too many messages or characters for the
        window), known before it is tokenized: no token counts to report."""
        err = cls.__new__(cls)
        InvalidRequestError.__init__(err, message, param=param)
        err.context_window = context_window
        err.prompt_tokens = err.completion_tokens = None
        return err


class ModelNotFoundError(WickError):
    default_status = 404
    default_type = "invalid_request_error"
    default_code = "model_not_found"

    def __init__(self, model: str, available: Iterable[str] = ()) -> None:
        names = ", ".join(sorted(available))
        hint = f" Available: {names}." if names else ""
        super().__init__(f"The model '{model}' does not exist.{hint}", param="model")
        self.model = model


class DeviceError(WickError):
    """The GPU (or its driver, or the browser's WebGPU) cannot do what was asked."""

    default_status = 500
    default_type = "device_error"
    default_code = "device_error"


class MissingFeatureError(DeviceError):
    """A device feature the artifact needs is absent; names the variants that work without it."""

    default_code = "missing_device_feature"

    def __init__(
        self, feature: str, working_variants: Iterable[str], *, requested: str | None = None
    ) -> None:
        variants = list(working_variants)
        what = f"'{requested}' needs" if requested else "This model variant needs"
        use = " or ".join(variants)
        super().__init__(
            f"{what} the WebGPU feature '{feature}', which this device lacks; "
            + (f"use {use} instead." if variants else "no variant works without it.")
        )
        self.feature = feature
        self.working_variants = variants


class ArtifactError(WickError):
    """An artifact file is missing, corrupt, or of a format this engine does not read."""

    default_status = 500
    default_type = "artifact_error"
    default_code = "artifact_invalid"

    def __init__(self, message: str, *, path: str | None = None, code: str | None = None) -> None:
        super().__init__(f"{path}: {message}" if path else message, code=code)
        self.path = path


class KVCacheFullError(WickError):
    """The page pool cannot hold a sequence even with every other sequence preempted."""

    default_status = 500
    default_type = "engine_error"
    default_code = "kv_cache_full"


class EngineAbortedError(WickError):
    """The engine stopped (a runner failure or a shutdown) while the request was in flight."""

    default_status = 503
    default_type = "engine_error"
    default_code = "engine_aborted"
