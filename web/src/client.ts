/**
 * wick in the browser, OpenAI-shaped:
 *
 *   import { createEngine } from "/static/web/wick.js";
 *   const engine = await createEngine("smollm2-135m-instruct", { quantization: "q4f32_1",
 *     onProgress: (p) => console.log(p.stage, p.loaded, p.total, p.text) });
 *   await engine.chat.completions.create({ messages, max_tokens: 64, temperature: 0 });
 *   for await (const chunk of await engine.chat.completions.create({ messages, stream: true })) {}
 *   await engine.completions.create({ prompt, max_tokens: 16 });
 *   engine.interrupt(); await engine.unload();
 *
 * The engine runs in a dedicated Worker (wick-worker.js): the same Python engine as the
 * server, in Pyodide, on WebGPU. Errors are typed (errors.ts) with the Python engine's messages.
 */

import {
  EngineAbortedError, ErrorPayload, WebGPUUnavailableError, WickError, errorFromPayload,
} from "./errors.js";
import type { EngineInfo, FromWorker, Progress, ToWorker } from "./worker_protocol.js";

export * from "./errors.js";
export type { EngineInfo, Progress } from "./worker_protocol.js";

// ---- the openai package's shapes (the subset wick returns) ----

export interface ChatCompletionMessageParam {
  role: "system" | "user" | "assistant" | "developer" | "tool";
  content: string | null | { type: "text"; text: string }[];
  name?: string;
  /** an earlier reply's thinking (reasoning models); the chat template may use it */
  reasoning_content?: string | null;
}
export interface SamplingParams {
  model?: string;
  max_tokens?: number | null;
  max_completion_tokens?: number | null;
  temperature?: number | null;
  top_p?: number | null;
  top_k?: number | null;
  n?: number | null;
  stop?: string | string[] | null;
  seed?: number | null;
  ignore_eos?: boolean;
  stream_options?: { include_usage?: boolean } | null;
  frequency_penalty?: number | null;
  presence_penalty?: number | null;
  /** token id (as a string) -> bias in [-100, 100] added to its logit */
  logit_bias?: Record<string, number> | null;
  /** wick extension (as vLLM): > 1 discourages tokens already in the prompt or output */
  repetition_penalty?: number | null;
  /** wick extension (as vLLM): keep tokens with p >= min_p * max p */
  min_p?: number | null;
  response_format?: ResponseFormat | null;
  [key: string]: unknown;
}
/** OpenAI's response formats, and wick's `grammar` (xgrammar EBNF with a `root` rule). */
export type ResponseFormat =
  | { type: "text" }
  | { type: "json_object" }
  | { type: "json_schema"; json_schema: { name: string; schema?: Record<string, unknown>;
      strict?: boolean | null; description?: string } }
  | { type: "grammar"; grammar: string };
export interface ChatCompletionCreateParamsBase extends SamplingParams {
  messages: ChatCompletionMessageParam[];
  logprobs?: boolean | null;
  /** 0-20, needs logprobs: true */
  top_logprobs?: number | null;
  /** extra chat template variables (as vLLM), e.g. `{ enable_thinking: false }` for Qwen3 */
  chat_template_kwargs?: Record<string, unknown> | null;
}
export interface CompletionCreateParamsBase extends SamplingParams {
  prompt: string | number[];
  /** legacy shape: how many most likely tokens to list beside each sampled one (0-20) */
  logprobs?: number | null;
}
export interface TopLogprob { token: string; logprob: number; bytes: number[] | null }
export interface ChatCompletionTokenLogprob extends TopLogprob { top_logprobs: TopLogprob[] }
export interface ChoiceLogprobs { content: ChatCompletionTokenLogprob[] | null; refusal: null }
export interface CompletionLogprobs {
  tokens: string[]; token_logprobs: number[]; top_logprobs: Record<string, number>[];
  text_offset: number[];
}
export interface CompletionUsage { prompt_tokens: number; completion_tokens: number; total_tokens: number }
export interface ChatCompletion {
  id: string;
  object: "chat.completion";
  created: number;
  model: string;
  /** `reasoning_content`: a reasoning model's thinking, apart from its answer (as vLLM) */
  choices: { index: number; message: { role: "assistant"; content: string | null; reasoning_content?: string | null }; finish_reason: string | null; logprobs: ChoiceLogprobs | null }[];
  usage?: CompletionUsage;
}
export interface ChatCompletionChunk {
  id: string;
  object: "chat.completion.chunk";
  created: number;
  model: string;
  choices: { index: number; delta: { role?: "assistant"; content?: string | null; reasoning_content?: string | null }; finish_reason: string | null; logprobs?: ChoiceLogprobs | null }[];
  usage?: CompletionUsage | null;
}
export interface Completion {
  id: string;
  object: "text_completion";
  created: number;
  model: string;
  choices: { index: number; text: string; finish_reason: string | null; logprobs: CompletionLogprobs | null }[];
  usage?: CompletionUsage | null;
}
export interface RequestOptions { signal?: AbortSignal }

export interface CreateEngineOptions {
  quantization?: string;
  onProgress?: (p: Progress) => void;
  /** Origin (and path prefix) of the wick server; default: this script's origin. */
  baseUrl?: string;
  /** Bytes of KV cache pages (default 256 MiB, capped by what the model can use). */
  kvCacheBytes?: number;
  /** Use the browser Cache API for artifact files (default true). */
  cache?: boolean;
  /** A weight download that receives nothing for this long is cut and resumed (default 30000). */
  stallTimeoutMs?: number;
  /** URL of wick-worker.js (default: next to wick.js). */
  workerUrl?: string | URL;
  /** The wick host's API key (`wick serve --api-key`), sent with every model file request. */
  apiKey?: string;
}

export interface EngineStats {
  model: string;
  quantization: string;
  device: string;
  steps: number;
  last_step: { plan_ms: number; backend_ms: number; engine_ms: number };
  totals: { steps: number; engine_ms: number; plan_ms: number; backend_ms: number;
    js_encode_ms: number; device_wait_ms: number };
  /** grammar bitmasks applied so far, and a sha256 over all of them (the native engine's
   * stats show the same digest for the same constrained requests) */
  grammar: { masks: number; digest: string };
}

type Listener = (m: FromWorker) => void;

/** An async iterable of chunks fed by worker messages. */
class ChunkStream<T> implements AsyncIterable<T> {
  private items: T[] = [];
  private waiting: { resolve: (r: IteratorResult<T>) => void; reject: (e: unknown) => void } | null = null;
  private ended = false;
  private failure: unknown = null;
  readonly controller: { abort: () => void };
  constructor(abort: () => void) {
    this.controller = { abort };
  }
  push(item: T) {
    if (this.waiting) { this.waiting.resolve({ value: item, done: false }); this.waiting = null; }
    else this.items.push(item);
  }
  end(error?: unknown) {
    this.ended = true;
    this.failure = error ?? null;
    if (this.waiting) {
      if (error) this.waiting.reject(error);
      else this.waiting.resolve({ value: undefined as T, done: true });
      this.waiting = null;
    }
  }
  [Symbol.asyncIterator](): AsyncIterator<T> {
    return {
      next: () => {
        if (this.items.length) return Promise.resolve({ value: this.items.shift()!, done: false });
        if (this.ended) {
          if (this.failure) { const f = this.failure; this.failure = null; return Promise.reject(f); }
          return Promise.resolve({ value: undefined as T, done: true });
        }
        return new Promise((resolve, reject) => { this.waiting = { resolve, reject }; });
      },
      return: () => {
        if (!this.ended) { this.controller.abort(); this.end(); }
        return Promise.resolve({ value: undefined as T, done: true });
      },
    };
  }
}

export class Engine {
  readonly info: EngineInfo;
  /** Why the browser cache could not keep this model's files (e.g. a CacheQuotaError when its
   * quota is exceeded), or null. The engine works either way; the next load downloads again. */
  readonly cacheError: WickError | null;
  readonly chat: { completions: { create: Engine["createChat"] } };
  readonly completions: { create: Engine["createCompletion"] };
  private worker: Worker | null;
  private listeners: Map<number, Listener>;
  private nextId: () => number;

  /** @internal */
  constructor(worker: Worker, info: EngineInfo, listeners: Map<number, Listener>, nextId: () => number) {
    this.worker = worker;
    this.info = info;
    this.cacheError = info.cacheError ? errorFromPayload(info.cacheError) : null;
    this.listeners = listeners;
    this.nextId = nextId;
    this.chat = { completions: { create: this.createChat.bind(this) } };
    this.completions = { create: this.createCompletion.bind(this) };
  }

  createChat(body: ChatCompletionCreateParamsBase & { stream: true }, opts?: RequestOptions): Promise<AsyncIterable<ChatCompletionChunk>>;
  createChat(body: ChatCompletionCreateParamsBase & { stream?: false | null }, opts?: RequestOptions): Promise<ChatCompletion>;
  createChat(body: ChatCompletionCreateParamsBase, opts?: RequestOptions): Promise<ChatCompletion | AsyncIterable<ChatCompletionChunk>>;
  createChat(body: ChatCompletionCreateParamsBase, opts?: RequestOptions): Promise<unknown> {
    return this.create("chat", body, opts);
  }

  createCompletion(body: CompletionCreateParamsBase & { stream: true }, opts?: RequestOptions): Promise<AsyncIterable<Completion>>;
  createCompletion(body: CompletionCreateParamsBase & { stream?: false | null }, opts?: RequestOptions): Promise<Completion>;
  createCompletion(body: CompletionCreateParamsBase, opts?: RequestOptions): Promise<Completion | AsyncIterable<Completion>>;
  createCompletion(body: CompletionCreateParamsBase, opts?: RequestOptions): Promise<unknown> {
    return this.create("completion", body, opts);
  }

  private create(api: "chat" | "completion", body: unknown, opts?: RequestOptions): Promise<unknown> {
    const worker = this.live();
    const signal = opts?.signal;
    if (signal?.aborted) return Promise.reject(aborted(signal));
    const id = this.nextId();
    const stream = (body as { stream?: unknown })?.stream === true;
    const cancel = () => worker.postMessage({ kind: "cancel", id } satisfies ToWorker);
    return new Promise((resolve, reject) => {
      let chunks: ChunkStream<unknown> | null = null;
      const onAbort = () => {
        cancel();
        const err = aborted(signal!);
        if (chunks) chunks.end(err); else reject(err);
        cleanup();
      };
      const cleanup = () => {
        this.listeners.delete(id);
        signal?.removeEventListener("abort", onAbort);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.listeners.set(id, (m) => {
        switch (m.kind) {
          case "result":
            cleanup();
            resolve(JSON.parse(m.data));
            break;
          case "chunk":
            if (!chunks) {
              chunks = new ChunkStream(() => { cancel(); cleanup(); });
              resolve(chunks);
            }
            chunks.push(JSON.parse(m.data));
            break;
          case "done":
            cleanup();
            if (!chunks) { chunks = new ChunkStream(() => {}); resolve(chunks); }
            chunks.end();
            break;
          case "error": {
            cleanup();
            const err = errorFromPayload(m.error);
            if (chunks) chunks.end(err); else reject(err);
            break;
          }
        }
      });
      let text: string;
      try {
        text = JSON.stringify(body ?? null);
      } catch (e) {
        cleanup();
        reject(e);
        return;
      }
      worker.postMessage({ kind: "create", id, api, body: text } satisfies ToWorker);
      void stream;
    });
  }

  /** Stop every running request: each ends with finish_reason "abort"; the engine stays usable. */
  interrupt(): void {
    this.live().postMessage({ kind: "interrupt", id: this.nextId() } satisfies ToWorker);
  }

  /** Engine statistics from the worker: model, device, steps run so far, and host-side
   * milliseconds of the last step and summed over all steps (Python engine, plan building,
   * the backend call; the latter split into JS encoding and waiting for the device). */
  stats(): Promise<EngineStats> {
    return this.call({ kind: "stats", id: this.nextId() }).then((d) => JSON.parse(d ?? "{}"));
  }

  /** Free the GPU and stop the worker. */
  async unload(): Promise<void> {
    if (!this.worker) return;
    try {
      await this.call({ kind: "unload", id: this.nextId() });
    } finally {
      this.worker?.terminate();
      this.worker = null;
      for (const l of this.listeners.values()) {
        l({ kind: "error", id: -1, error: { error: { message: "the engine was unloaded", type: "engine_error",
          param: null, code: "engine_aborted" }, status: 503, class: "EngineAbortedError" } });
      }
      this.listeners.clear();
    }
  }

  private call(msg: ToWorker): Promise<string | undefined> {
    const worker = this.live();
    return new Promise((resolve, reject) => {
      this.listeners.set(msg.id, (m) => {
        this.listeners.delete(msg.id);
        if (m.kind === "error") reject(errorFromPayload(m.error));
        else resolve(m.kind === "ok" ? m.data : undefined);
      });
      worker.postMessage(msg);
    });
  }

  private live(): Worker {
    if (!this.worker) {
      throw new EngineAbortedError({ message: "the engine was unloaded", type: "engine_error", param: null,
        code: "engine_aborted" }, 503);
    }
    return this.worker;
  }
}

/** The typed error of an aborted request; the signal's reason is its `cause`. */
function aborted(signal: AbortSignal): Error {
  const err = new EngineAbortedError({ message: "the request was aborted", type: "engine_error", param: null,
    code: "engine_aborted" }, 503);
  (err as Error & { cause?: unknown }).cause = signal.reason;
  return err;
}

/** A module Worker running `url`. A Worker's script must have the page's origin: when wick.js
 * was imported from another origin (a wick host started with --cors-origin for this page), a
 * same-origin blob module imports the real worker script, which then loads everything from
 * the wick host with CORS. */
function spawnWorker(url: URL): Worker {
  if (url.origin === globalThis.location?.origin) return new Worker(url, { type: "module" });
  const shim = URL.createObjectURL(new Blob([`import ${JSON.stringify(url.href)};\n`],
    { type: "text/javascript" }));
  const worker = new Worker(shim, { type: "module" });
  const revoke = () => URL.revokeObjectURL(shim);
  worker.addEventListener("message", revoke, { once: true });
  worker.addEventListener("error", revoke, { once: true });
  return worker;
}

/** Load `model` (a served model id, `id-quantization`, or artifact id) into a new worker. */
export async function createEngine(model: string, options: CreateEngineOptions = {}): Promise<Engine> {
  if (!(globalThis.navigator as Navigator | undefined)?.gpu) {
    throw new WebGPUUnavailableError({
      message: "WebGPU is not available in this browser (navigator.gpu is missing). wick's browser " +
        "engine needs WebGPU (Chrome/Edge 113+); on a device without shader-f16 use q4f32_1 or q0f32.",
      type: "device_error", param: null, code: "no_webgpu" }, 500);
  }
  const here = new URL(import.meta.url);
  const baseUrl = (options.baseUrl ?? here.origin).replace(/\/$/, "");
  const worker = spawnWorker(new URL(options.workerUrl ?? "./wick-worker.js", import.meta.url));
  const listeners = new Map<number, Listener>();
  let counter = 0;
  const nextId = () => ++counter;
  worker.onmessage = (ev: MessageEvent<FromWorker>) => listeners.get(ev.data.id)?.(ev.data);
  const id = nextId();
  try {
    const info = await new Promise<EngineInfo>((resolve, reject) => {
      worker.onerror = (ev) => reject(new WickError({ message: `the wick worker failed: ${ev.message}`,
        type: "load_error", param: null, code: "worker_error" }, 500));
      listeners.set(id, (m) => {
        if (m.kind === "progress") options.onProgress?.(m.progress);
        else if (m.kind === "loaded") { listeners.delete(id); resolve(m.info); }
        else if (m.kind === "error") { listeners.delete(id); reject(errorFromPayload(m.error as ErrorPayload)); }
      });
      worker.postMessage({ kind: "load", id, model, quantization: options.quantization, baseUrl,
        kvCacheBytes: options.kvCacheBytes, cache: options.cache,
        stallTimeoutMs: options.stallTimeoutMs, apiKey: options.apiKey } satisfies ToWorker);
    });
    worker.onerror = null;
    return new Engine(worker, info, listeners, nextId);
  } catch (e) {
    worker.terminate();
    throw e;
  }
}
