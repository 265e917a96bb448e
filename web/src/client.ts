/**
 * wick in the browser, OpenAI-shaped:
 *
 *   import { createEngine } from "/static/web/wick.js";
 *   const engine = await createEngine("smollm2-135m-instruct", { quantization: "q4f32_1",
 *     onProgress: (p) => console.log(p.stage, p.loaded, p.total, p.text) });
 *   await engine.chat.completions.create({ messages, max_tokens: 64, temperature: 0 });
 *   for await (const chunk of await engine.chat.completions.create({ messages, stream: true })) {}
 *   await engine.completions.create({ prompt, max_tokens: 16 });
 *   await embedder.embeddings.create({ input: ["a text", "another"] });  // an embedding model
 *   engine.abortAll(); await engine.unload();
 *
 * The engine runs in a dedicated Worker (wick-worker.js): the same Python engine as the
 * server, in Pyodide, on WebGPU. Errors are typed (errors.ts) with the Python engine's messages.
 */

import {
  EngineAbortedError, ErrorPayload, InvalidRequestError, WebGPUUnavailableError, WickError,
  engineLost, errorFromPayload, payload, permissionDenied,
} from "./errors.js";
import { settings } from "./extension/settings.js";
import { BACKENDS, PORT_NAME, PROTOCOL, VERSION, protocolMismatch } from "./worker_protocol.js";
import type { Api, Backend, EngineInfo, FromWorker, Progress, ToWorker } from "./worker_protocol.js";
import type * as P from "./protocol.gen.js";

export * from "./errors.js";
export type { Backend, EngineInfo, Progress } from "./worker_protocol.js";

// ---- the openai package's shapes (the subset wick takes and returns) ----
// Generated from the engine's protocol (protocol.gen.ts, by web/protocol_types.py): named here
// as the openai npm package names them.

export type * as Protocol from "./protocol.gen.js";
export type ChatCompletionMessageParam = P.ChatRequestMessage;
/** A chat request; `stream` is chosen by `create`'s overloads. */
export type ChatCompletionCreateParamsBase = Omit<P.ChatCompletionRequest, "stream">;
export type CompletionCreateParamsBase = Omit<P.CompletionRequest, "stream">;
/** OpenAI's response formats, and wick's `grammar` (xgrammar EBNF with a `root` rule). */
export type ResponseFormat = NonNullable<P.ChatCompletionRequest["response_format"]>;
export type ChatCompletionTool = NonNullable<P.ChatCompletionRequest["tools"]>[number];
export type ChatCompletionToolChoiceOption = NonNullable<P.ChatCompletionRequest["tool_choice"]>;
export type ChatCompletionMessageToolCall = NonNullable<P.ChatMessage["tool_calls"]>[number];
export type ChatCompletionChunkToolCall = NonNullable<P.ChoiceDelta["tool_calls"]>[number];
export type TopLogprob = P.TopLogprob;
export type ChatCompletionTokenLogprob = P.TokenLogprob;
export type ChoiceLogprobs = P.ChoiceLogprobs;
export type CompletionLogprobs = P.CompletionLogprobs;
export type CompletionUsage = P.CompletionUsage;
export type ChatCompletion = P.ChatCompletion;
export type ChatCompletionChunk = P.ChatCompletionChunk;
export type Completion = P.Completion;
/** OpenAI's embeddings request: `input` a string, strings, token ids or lists of token ids
 * (an embedding model, e.g. all-minilm-l6-v2). `encoding_format: "base64"` gives each vector
 * as little-endian float32 bytes in base64. */
export type EmbeddingCreateParams = P.EmbeddingRequest;
export type CreateEmbeddingResponse = P.CreateEmbeddingResponse;
export interface RequestOptions { signal?: AbortSignal }

export interface SpeculativeOptions {
  method: "ngram" | "draft";
  numTokens?: number;
  /** Method "draft": the model that drafts (default: this model) and its variant (default: its
   * 4-bit twin, q4f32_1), fetched from the same host as the model. */
  model?: string;
  quantization?: string;
}

export interface CreateEngineOptions {
  quantization?: string;
  onProgress?: (p: Progress) => void;
  /** Origin (and path prefix) of the wick host or `wick export` site the models, the runtime
   * and the worker come from; default: the one this script came from (the path before its
   * `/static/`). Needed where wick.js is bundled into an app (npm). Another origin must send
   * CORS headers. */
  baseUrl?: string;
  /** Bytes of KV cache pages (default 256 MiB, capped by what the model can use). */
  kvCacheBytes?: number;
  /** Reuse the KV of prompt pages computed before: a chat's earlier turns, a shared system
   * prompt, n>1 choices (default true). `usage.prompt_tokens_details.cached_tokens` counts them. */
  prefixCache?: boolean;
  /** Speculative decoding: draft tokens and verify them in one step, output unchanged.
   * `{ method: "ngram" }` copies drafts from the prompt and the text so far; `numTokens` bounds
   * the drafts per step (default 8; the engine drafts fewer where they are not accepted).
   * `{ method: "draft" }` has a smaller model draft: by default this model's own 4-bit variant
   * drafting for its f32 or 8-bit one (`info.draft` says which loaded).
   * Requests with `prediction` draft from it with or without this. */
  speculative?: SpeculativeOptions;
  /** Use the browser Cache API for artifact files (default true). */
  cache?: boolean;
  /** A weight download that receives nothing for this long is cut and resumed (default 30000). */
  stallTimeoutMs?: number;
  /** URL of wick-worker.js (default: next to wick.js). */
  workerUrl?: string | URL;
  /** The wick host's API key (`wick serve --api-key`), sent with every model file request. */
  apiKey?: string;
  /** One engine for every tab of this origin (a SharedWorker): a tab asking for the model that
   * is loaded attaches to it instead of loading its own copy. */
  shared?: boolean;
  /** Where the kernels run (`engine.info.backend` says which did): "webgpu", the WebAssembly
   * kernels on the CPU ("wasm"), or "auto" (default): WebGPU on a hardware adapter that can run
   * the variant, else wasm (no WebGPU, or only a software adapter such as SwiftShader). */
  backend?: Backend;
  /** The WebAssembly kernels' fused multiply-adds (relaxed SIMD: Chrome 114+), where the
   * browser has them (default true; `engine.info.device` says "relaxed SIMD" when they run).
   * false: the plain SIMD kernels, whose results are the same bits on every machine (a relaxed
   * multiply-add rounds once or twice, as the machine's CPU has it). */
  relaxedSimd?: boolean;
}

export interface EngineStats {
  model: string;
  quantization: string;
  device: string;
  steps: number;
  /** tokens the engine computed so far (prompt chunks and decode inputs; not cached ones) */
  tokens_computed: number;
  last_step: { plan_ms: number; backend_ms: number; engine_ms: number };
  totals: { steps: number; engine_ms: number; plan_ms: number; backend_ms: number;
    js_encode_ms: number; device_wait_ms: number };
  /** grammar bitmasks applied so far, and a sha256 over all of them (the native engine's
   * stats show the same digest for the same constrained requests) */
  grammar: { masks: number; digest: string };
  /** (the WebAssembly backend) the kernels that took the most time so far, its threads, and
   * the tasks of parallel loops its helper threads ran */
  kernels?: { name: string; ms: number; calls: number }[];
  threads?: number;
  helperTasks?: number;
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

/** One client's line to an engine host: the typed messages of worker_protocol.ts over a
 * dedicated Worker, a SharedWorker's MessagePort or a chrome.runtime Port (the extension). */
export interface Channel {
  post(m: ToWorker): void;
  /** every message from the host */
  onMessage(listener: (m: FromWorker) => void): void;
  /** the host went away: its worker failed, the port disconnected */
  onLost(listener: () => void): void;
  /** watch the Web Lock the host holds while it lives (a SharedWorker's `hostLock`) */
  watchHost?(lock: string): void;
  /** this client is done with the host */
  close(): void;
}

/** A channel to a host that has loaded this client's model, and what it loaded. */
type Attach = (onProgress?: (p: Progress) => void) => Promise<{ channel: Channel; info: EngineInfo }>;

export class Engine {
  info: EngineInfo;
  /** Why the browser cache could not keep this model's files (e.g. a CacheQuotaError when its
   * quota is exceeded), or null. The engine works either way; the next load downloads again. */
  readonly cacheError: WickError | null;
  readonly chat: { completions: { create: Engine["createChat"] } };
  readonly completions: { create: Engine["createCompletion"] };
  readonly embeddings: { create: Engine["createEmbedding"] };
  private channel: Channel | null;
  private reattaching: Promise<Channel> | null = null;
  private unloaded = false;
  private readonly listeners = new Map<number, Listener>();
  private counter = 0;

  /** @internal */
  constructor(channel: Channel, info: EngineInfo, private readonly attach: Attach) {
    this.info = info;
    this.cacheError = info.cacheError ? errorFromPayload(info.cacheError) : null;
    this.chat = { completions: { create: this.createChat.bind(this) } };
    this.completions = { create: this.createCompletion.bind(this) };
    this.embeddings = { create: this.createEmbedding.bind(this) };
    this.channel = null;
    this.use(channel);
  }

  private use(channel: Channel): void {
    this.channel = channel;
    channel.onMessage((m) => this.listeners.get(m.id)?.(m));
    channel.onLost(() => {
      if (this.channel !== channel) return;
      this.channel = null;
      channel.close(); // (a failed worker is terminated, not left beside the next one)
      this.failAll(engineLost());
    });
  }

  private failAll(p: ErrorPayload): void {
    const pending = [...this.listeners.values()];
    this.listeners.clear();
    for (const l of pending) l({ kind: "error", id: -1, error: p });
  }

  private nextId(): number {
    return ++this.counter;
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

  /** One vector per input, `data[i]` for input i (an embedding model). */
  createEmbedding(body: EmbeddingCreateParams, opts?: RequestOptions): Promise<CreateEmbeddingResponse> {
    return this.create("embeddings", body, opts) as Promise<CreateEmbeddingResponse>;
  }

  private async create(api: Api, body: unknown, opts?: RequestOptions): Promise<unknown> {
    const signal = opts?.signal;
    if (signal?.aborted) throw aborted(signal);
    let text: string;
    try {
      text = JSON.stringify(body ?? null);
    } catch (e) {
      throw new InvalidRequestError({ message: `The request cannot be sent: ${(e as Error).message}`,
        type: "invalid_request_error", param: null, code: "invalid_body" }, 400);
    }
    const channel = await this.live();
    const id = this.nextId();
    const abort = () => channel.post({ kind: "abort", id });
    return new Promise((resolve, reject) => {
      let chunks: ChunkStream<unknown> | null = null;
      const onAbort = () => {
        abort();
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
              chunks = new ChunkStream(() => { abort(); cleanup(); });
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
      channel.post({ kind: "create", id, api, body: text });
    });
  }

  /** Stop this engine's running requests: each ends with finish_reason "abort" (on an engine
   * shared with other clients, they end as aborted requests; others' requests go on). */
  abortAll(): void {
    this.channel?.post({ kind: "abortAll", id: this.nextId() });
  }

  /** @deprecated the earlier name of {@link abortAll} (WebLLM's is interruptGenerate). */
  interrupt(): void {
    this.abortAll();
  }

  /** Engine statistics from the host: model, device, steps run so far, and host-side
   * milliseconds of the last step and summed over all steps (Python engine, plan building,
   * the backend call; the latter split into JS encoding and waiting for the device). */
  stats(): Promise<EngineStats> {
    return this.call("stats").then((d) => JSON.parse(d ?? "{}"));
  }

  /** Let go of the engine: a page's own engine frees the GPU and stops its worker; a shared or
   * extension engine stays loaded for its other clients (and the next attach). */
  async unload(): Promise<void> {
    if (this.unloaded) return;
    this.unloaded = true;
    const channel = this.channel;
    try {
      if (channel) await this.call("unload", channel);
    } finally {
      channel?.close();
      this.channel = null;
      this.failAll(payload("EngineAbortedError", "the engine was unloaded", "engine_error", "engine_aborted", 503));
    }
  }

  private async call(kind: "stats" | "unload", on?: Channel): Promise<string | undefined> {
    const channel = on ?? await this.live();
    const id = this.nextId();
    return new Promise((resolve, reject) => {
      this.listeners.set(id, (m) => {
        this.listeners.delete(id);
        if (m.kind === "error") reject(errorFromPayload(m.error));
        else resolve(m.kind === "ok" ? m.data : undefined);
      });
      channel.post({ kind, id });
    });
  }

  /** The channel, attached again (the model reloads from the browser cache) if the host was lost. */
  private async live(): Promise<Channel> {
    if (this.unloaded) {
      throw new EngineAbortedError({ message: "the engine was unloaded", type: "engine_error", param: null,
        code: "engine_aborted" }, 503);
    }
    if (this.channel) return this.channel;
    this.reattaching ??= this.attach().then(({ channel, info }) => {
      if (this.unloaded) { // unload() came while the model loaded again
        channel.close();
        throw new EngineAbortedError({ message: "the engine was unloaded", type: "engine_error",
          param: null, code: "engine_aborted" }, 503);
      }
      this.info = info;
      this.use(channel);
      return channel;
    }).finally(() => { this.reattaching = null; });
    return this.reattaching;
  }
}

/** The typed error of an aborted request; the signal's reason is its `cause`. */
function aborted(signal: AbortSignal): Error {
  const err = new EngineAbortedError({ message: "the request was aborted", type: "engine_error", param: null,
    code: "engine_aborted" }, 503);
  (err as Error & { cause?: unknown }).cause = signal.reason;
  return err;
}

/** Whether this module is a wick site's own /static/wick.js (not bundled into an app). */
function isSiteModule(): boolean {
  return /\/static\/(web\/)?wick\.js$/.test(new URL(import.meta.url).pathname);
}

/** The wick site this module came from: its URL up to its `/static/` directory (a wick
 * host's /static/wick.js, or a `wick export` site's DIR/static/wick.js at any path), else its
 * directory. Models, artifacts and the runtime are found below it. */
function siteRoot(): string {
  const url = new URL(import.meta.url);
  const at = url.pathname.lastIndexOf("/static/");
  return url.origin + (at >= 0 ? url.pathname.slice(0, at) : url.pathname.replace(/\/[^/]*$/, ""));
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

function workerChannel(worker: Worker): Channel {
  return {
    post: (m) => worker.postMessage(m),
    onMessage: (l) => { worker.onmessage = (ev: MessageEvent<FromWorker>) => l(ev.data); },
    onLost: (l) => { worker.onerror = () => l(); },
    close: () => worker.terminate(),
  };
}

/** A SharedWorker's port. The tab holds a Web Lock while it lives: the engine learns of a
 * closed tab when the lock is released, and cancels that tab's requests. */
function sharedChannel(port: MessagePort, worker: SharedWorker, release: () => void): Channel {
  const lost: (() => void)[] = [];
  const watching = new AbortController();
  const fire = () => { for (const l of lost) l(); };
  worker.onerror = fire;
  return {
    post: (m) => port.postMessage(m),
    onMessage: (l) => { port.onmessage = (ev: MessageEvent<FromWorker>) => l(ev.data); },
    onLost: (l) => { lost.push(l); },
    // a MessagePort never says its worker died (a crash, the browser killing it): the worker's
    // lock is granted to us only then
    watchHost: (lock) => {
      navigator.locks.request(lock, { signal: watching.signal }, fire).catch(() => {});
    },
    close: () => {
      watching.abort();
      port.postMessage({ kind: "detach", id: 0 } satisfies ToWorker); port.close(); release();
    },
  };
}

function chromePortChannel(port: chrome.runtime.Port): Channel {
  let closed = false;
  return {
    post: (m) => { if (!closed) port.postMessage(m); },
    onMessage: (l) => port.onMessage.addListener((m: FromWorker) => l(m)),
    onLost: (l) => port.onDisconnect.addListener(() => { closed = true; l(); }),
    close: () => { closed = true; port.disconnect(); },
  };
}

/** Send `load` over `channel` and wait for the host to load (or attach to) the model. */
function loadOver(channel: Channel, load: Omit<Extract<ToWorker, { kind: "load" }>, "id">,
                  onProgress?: (p: Progress) => void,
                  lost: () => ErrorPayload = engineLost): Promise<EngineInfo> {
  const id = 0; // the channel is new: its first call
  return new Promise<EngineInfo>((resolve, reject) => {
    channel.onLost(() => reject(errorFromPayload(lost())));
    channel.onMessage((m) => {
      if (m.id !== id) return;
      if (m.kind === "progress") onProgress?.(m.progress);
      else if (m.kind === "loaded") {
        // (a host of another build, older than this check, sends no protocol)
        if (m.info.protocol !== PROTOCOL) {
          reject(errorFromPayload(protocolMismatch(VERSION, m.info.version ?? null)));
          return;
        }
        if (m.hostLock) channel.watchHost?.(m.hostLock);
        resolve(m.info);
      }
      else if (m.kind === "error") reject(errorFromPayload(m.error));
    });
    channel.post({ ...load, id });
  }).catch((e) => {
    channel.close();
    throw e;
  });
}

function noWebGPU(): WebGPUUnavailableError {
  return new WebGPUUnavailableError({
    message: "WebGPU is not available in this browser (navigator.gpu is missing), and " +
      "{ backend: \"webgpu\" } asks for it: leave backend out (or \"wasm\") to run the " +
      "WebAssembly kernels on the CPU.",
    type: "device_error", param: "backend", code: "no_webgpu" }, 500);
}

/** Inside the wick Chrome extension (its side panel, options or any page of it). */
function inExtension(): boolean {
  return globalThis.location?.protocol === "chrome-extension:" && Boolean(globalThis.chrome?.runtime?.id);
}

function loadMessage(model: string, options: CreateEngineOptions, baseUrl: string) {
  return { kind: "load" as const, model, quantization: options.quantization, baseUrl,
    protocol: PROTOCOL, version: VERSION,
    kvCacheBytes: options.kvCacheBytes, prefixCache: options.prefixCache, cache: options.cache,
    speculative: options.speculative,
    stallTimeoutMs: options.stallTimeoutMs,
    apiKey: options.apiKey, backend: options.backend, relaxedSimd: options.relaxedSimd };
}

async function finish(attach: Attach, options: CreateEngineOptions): Promise<Engine> {
  const { channel, info } = await attach(options.onProgress);
  return new Engine(channel, info, attach);
}

/** Load `model` (a served model id, `id-quantization`, or artifact id) into an engine:
 * - by default, a new Worker of this page;
 * - `{ shared: true }`: the one engine of this origin, in a SharedWorker: every tab that asks
 *   for the same model attaches to it (weights loaded once, requests batched together);
 * - in a page of the wick Chrome extension: the extension's one engine (offscreen document).
 * If the engine's host is lost (its worker or document closed), pending requests fail with an
 * EngineLostError and the next request loads it again (from the browser cache). */
export async function createEngine(model: string, options: CreateEngineOptions = {}): Promise<Engine> {
  const backend = options.backend ?? "auto";
  if (!BACKENDS.includes(backend)) {
    throw new InvalidRequestError({ message: `backend must be one of ${BACKENDS.join(", ")}, got ` +
      `${JSON.stringify(backend)}`, type: "invalid_request_error", param: "backend",
      code: "invalid_backend" }, 400);
  }
  if (inExtension()) return connectExtension(null, model, options);
  if (backend === "webgpu" && !(globalThis.navigator as Navigator | undefined)?.gpu) throw noWebGPU();
  // (absolute: the worker resolves nothing against the page)
  const baseUrl = (options.baseUrl === undefined ? siteRoot()
    : new URL(options.baseUrl, globalThis.location?.href).href).replace(/\/$/, "");
  // the worker beside this module where it is a wick site's own wick.js (a host's or an
  // export's), else (wick.js bundled into an app from npm) the one the baseUrl site serves:
  // the same version as its runtime
  const workerUrl = options.workerUrl !== undefined ? new URL(options.workerUrl, import.meta.url)
    : new URL(isSiteModule() || options.baseUrl === undefined ? "./wick-worker.js"
      : `${baseUrl}/static/wick-worker.js`, import.meta.url);
  const load = loadMessage(model, options, baseUrl);
  if (options.shared) {
    if (workerUrl.origin !== globalThis.location?.origin) {
      throw new InvalidRequestError({ message: "{ shared: true } needs wick.js from this page's own " +
        "origin (a SharedWorker's script must be same-origin).", type: "invalid_request_error",
        param: "shared", code: "shared_cross_origin" }, 400);
    }
    return finish(async (onProgress) => {
      const worker = new SharedWorker(workerUrl, { type: "module", name: "wick-engine" });
      const lock = `wick-client-${crypto.randomUUID()}`;
      let release = () => {};
      await new Promise<void>((held) => {
        void navigator.locks.request(lock, () => new Promise<void>((r) => { release = r; held(); }));
      });
      const channel = sharedChannel(worker.port, worker, release);
      return { channel, info: await loadOver(channel, { ...load, clientLock: lock }, onProgress) };
    }, options);
  }
  return finish(async (onProgress) => {
    const worker = spawnWorker(workerUrl);
    const channel = workerChannel(worker);
    const failed = () => payload("WickError", "the wick worker failed to start", "load_error", "worker_error", 500);
    return { channel, info: await loadOver(channel, load, onProgress, failed) };
  }, options);
}

/** The wick Chrome extension's engine, from a web page the user has allowed in the extension's
 * options (`extensionId`: the extension's id, chrome://extensions). The model files come from
 * the extension's host; the page downloads nothing. A page the user has not allowed (or no such
 * extension) gets a PermissionDeniedError. */
export async function createExtensionEngine(extensionId: string, model: string,
                                            options: Omit<CreateEngineOptions, "shared" | "workerUrl"> = {}): Promise<Engine> {
  return connectExtension(extensionId, model, options);
}

async function connectExtension(extensionId: string | null, model: string,
                                options: CreateEngineOptions): Promise<Engine> {
  if (extensionId === null) {
    const config = await settings();
    const baseUrl = (options.baseUrl ?? config.host).replace(/\/$/, "");
    const load = loadMessage(model, { apiKey: config.apiKey, ...options }, baseUrl);
    return finish(async (onProgress) => {
      const started = await chrome.runtime.sendMessage({ wick: "start-engine" }); // the offscreen document
      if (started?.error) {
        throw errorFromPayload(payload("LoadError", `the extension could not start its engine: ${started.error}`,
          "load_error", "engine_start_failed", 500));
      }
      const channel = chromePortChannel(chrome.runtime.connect({ name: PORT_NAME }));
      return { channel, info: await loadOver(channel, load, onProgress) };
    }, options);
  }
  // a web page: chrome.runtime exists here only if an extension lists this origin as
  // externally_connectable; the extension decides the rest (and where the files come from)
  const runtime = (globalThis as { chrome?: typeof chrome }).chrome?.runtime;
  if (!runtime?.connect) throw errorFromPayload(permissionDenied());
  const load = loadMessage(model, options, "");
  return finish(async (onProgress) => {
    let port: chrome.runtime.Port;
    try {
      port = runtime.connect(extensionId, { name: PORT_NAME });
    } catch {
      throw errorFromPayload(permissionDenied());
    }
    const channel = chromePortChannel(port);
    let answered = false;
    const info = await loadOver(channel, load, (p) => { answered = true; onProgress?.(p); },
      () => (answered ? engineLost() : permissionDenied()));
    return { channel, info };
  }, options);
}
