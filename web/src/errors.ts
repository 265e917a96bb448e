/**
 * Typed errors, rebuilt from the engine's error dict (engine/errors.py `to_dict()`): the same
 * message, type, param and code as the Python engine, plus the HTTP-equivalent status.
 */

export interface ErrorBody {
  message: string;
  type: string;
  param: string | null;
  code: string | null;
}

/** What crosses the worker boundary for a failure. */
export interface ErrorPayload {
  error: ErrorBody;
  status: number;
  class: string; // the Python (or worker) class name, e.g. "ContextLengthExceededError"
}

export class WickError extends Error {
  readonly type: string;
  readonly param: string | null;
  readonly code: string | null;
  readonly status: number;
  readonly error: ErrorBody;
  constructor(body: ErrorBody, status = 500) {
    super(body.message);
    this.name = new.target.name;
    this.type = body.type;
    this.param = body.param;
    this.code = body.code;
    this.status = status;
    this.error = body;
  }
  toJSON(): { error: ErrorBody } {
    return { error: this.error };
  }
}

/** 400: the request is wrong (bad value, unknown field, too long). */
export class InvalidRequestError extends WickError {}
export class UnsupportedParameterError extends InvalidRequestError {}
export class ContextLengthExceededError extends InvalidRequestError {}
/** 404: no such model (or variant) on this host. */
export class ModelNotFoundError extends WickError {}
/** The GPU / WebGPU cannot do what was asked. */
export class DeviceError extends WickError {}
/** A WebGPU feature the variant needs (e.g. shader-f16) is absent; the message names the
 * variants that work (q4f32_1, q0f32). */
export class MissingFeatureError extends DeviceError {}
/** No WebGPU (navigator.gpu missing) or no adapter. */
export class WebGPUUnavailableError extends DeviceError {}
/** An artifact file is missing or corrupt, or its format is unknown. */
export class ArtifactError extends WickError {}
/** The browser's Cache API refused to store a file (quota). */
export class CacheQuotaError extends ArtifactError {}
export class KVCacheFullError extends WickError {}
/** The request was aborted (AbortSignal) or the engine was unloaded while it ran. */
export class EngineAbortedError extends WickError {}
/** A failure to download or boot (network, Pyodide). */
export class LoadError extends WickError {}
/** 403: this page's origin may not use the extension's engine (the user has not allowed it in
 * the extension's options, or the extension does not exist). Says nothing more, on purpose. */
export class PermissionDeniedError extends WickError {}
/** The engine's host went away (its worker or the extension's offscreen document was closed)
 * while a request ran; the next request loads the engine again (from the browser cache). */
export class EngineLostError extends WickError {}
/** 409: a shared engine runs another model for other clients; it switches models only when
 * no one else is attached. */
export class ModelInUseError extends WickError {}
/** 401: the wick host needs an API key (`createEngine(model, { apiKey })`), or another one. */
export class AuthenticationError extends WickError {}

const CLASSES: Record<string, new (body: ErrorBody, status?: number) => WickError> = {
  WickError, InvalidRequestError, UnsupportedParameterError, ContextLengthExceededError,
  ModelNotFoundError, DeviceError, MissingFeatureError, WebGPUUnavailableError, ArtifactError,
  CacheQuotaError, KVCacheFullError, EngineAbortedError, LoadError, AuthenticationError,
  PermissionDeniedError, EngineLostError, ModelInUseError, KernelCompileError: DeviceError,
};

/** The typed error for a payload: by class name, else by type/code. */
export function errorFromPayload(p: ErrorPayload): WickError {
  let cls = CLASSES[p.class];
  if (!cls) {
    const t = p.error.type;
    cls = t === "invalid_request_error" ? (p.error.code === "model_not_found" ? ModelNotFoundError : InvalidRequestError)
      : t === "device_error" ? DeviceError : t === "artifact_error" ? ArtifactError : WickError;
  }
  return new cls(p.error, p.status);
}

export function payload(cls: string, message: string, type: string, code: string | null,
                        status: number, param: string | null = null): ErrorPayload {
  return { error: { message, type, param, code }, status, class: cls };
}

/** As Python's ModelNotFoundError(model, available). */
export function modelNotFound(model: string, available: string[]): ErrorPayload {
  const names = [...available].sort().join(", ");
  return payload("ModelNotFoundError",
    `The model '${model}' does not exist.${names ? ` Available: ${names}.` : ""}`,
    "invalid_request_error", "model_not_found", 404, "model");
}

/** As Python's MissingFeatureError(feature, variants, requested=...). */
export function missingFeature(feature: string, variants: string[], requested?: string): ErrorPayload {
  const what = requested ? `'${requested}' needs` : "This model variant needs";
  const use = variants.join(" or ");
  return payload("MissingFeatureError",
    `${what} the WebGPU feature '${feature}', which this device lacks; ` +
      (variants.length ? `use ${use} instead.` : "no variant works without it."),
    "device_error", "missing_device_feature", 500);
}

export const permissionDenied = (): ErrorPayload => payload("PermissionDeniedError",
  "This site may not use the wick extension's engine: allow it in the extension's options.",
  "permission_error", "origin_not_allowed", 403);

export const engineLost = (): ErrorPayload => payload("EngineLostError",
  "The engine's host stopped (its worker or the extension's offscreen document was closed); " +
    "the next request loads the model again.", "engine_error", "engine_lost", 503);
