/** The typed messages between a client (client.ts) and the engine's host (worker.ts, hub.ts):
 * tagged unions on `kind`, every message carries the `id` of the call it belongs to. The same
 * messages travel over a Worker, a SharedWorker's MessagePort or a chrome.runtime port (the
 * extension), so every one of them is plain JSON. */

import { payload } from "./errors.js";
import type { ErrorPayload } from "./errors.js";

// set by the build (web/build.mjs): the package's version, and a digest of this file and
// errors.ts, which both ends of a channel are built from; two builds of different protocols
// refuse each other with a typed error (an app bundling wick-web against another wick
// version's site)
declare const __WICK_VERSION__: string;
declare const __WICK_PROTOCOL__: string;
export const VERSION: string = __WICK_VERSION__;
export const PROTOCOL: string = __WICK_PROTOCOL__;

/** The client's and the host's builds differ: what to do about it. Versions are null where
 * a side does not say (a build older than this check). */
export function protocolMismatch(client: string | null, host: string | null): ErrorPayload {
  const name = (v: string | null) => (v === null ? "an older build of wick" : `wick ${v}`);
  const same = client !== null && client === host;
  const install = host === null || same ? "the wick-web version of the site's wick"
    : `the matching package (npm install wick-web@${host})`;
  return payload("LoadError", `this wick.js (${name(client)}) and the engine it reached ` +
    `(${same ? `another build of wick ${host}` : name(host)}) speak different versions of the ` +
    "worker protocol: import wick.js from the site that serves the engine, or install " +
    install, "load_error", "protocol_mismatch", 400, "baseUrl");
}

/** The request kinds the engine serves (the Python host's ``start`` dispatches on them). */
export type Api = "chat" | "completion" | "embeddings";

export interface Progress {
  // boot: Pyodide and the engine; prepare: the server is compiling a variant this device can
  // run (steps of its compile); compile: kernels into pipelines; download: weight bytes (from
  // the network or the cache; the first shards while Python boots, so this stage can come
  // before "compile"); cache: a note on the browser cache
  stage: "boot" | "prepare" | "compile" | "download" | "cache" | "ready";
  loaded: number; // bytes (download) or steps done
  total: number;
  text: string;
}

/** Where kernels run: WebGPU, or the WebAssembly kernels on the CPU; "auto" picks. */
export type Backend = "auto" | "webgpu" | "wasm";
export const BACKENDS: readonly Backend[] = ["auto", "webgpu", "wasm"];

export interface EngineInfo {
  model: string;
  quantization: string;
  artifactId: string;
  backend: "webgpu" | "wasm";
  device: string;
  threads: number; // CPU threads of the wasm kernels (1: not cross-origin isolated); 0 on WebGPU
  features: string[];
  shardRequests: number; // shards fetched over the network by this load
  // shards whose fetch began as soon as the manifest was read (while Python boots), not when
  // the engine asked for them
  shardsFetchedAhead: number;
  shardsFromCache: number;
  shardsRefetched: number; // cached shards that failed sha256 and were downloaded again
  resumedRequests: number; // Range requests that continued a cut-off download
  cacheError: ErrorPayload | null; // the cache could not keep the files, e.g. its quota is exceeded
  // how this worker's Python started: from its snapshot of an earlier start (the browser
  // cache), or from scratch (Pyodide booted, the engine imported, a snapshot kept), in ms
  python: { ms: number; from: "snapshot" | "scratch" }; // (once per worker: its first load's)
  protocol: string; // the host's build (PROTOCOL, VERSION)
  version: string;
  attached: boolean; // joined an engine another client had loaded (shared / extension): no downloads
  // the model drafting for this one (createEngine's speculative: {method: "draft"}), else null
  draft: { model: string; quantization: string; artifactId: string } | null;
  // what a request leaving sampling fields unset gets (the checkpoint's generation_config.json
  // or the built-in registry's model card), and what an interactive chat should send for them
  samplingDefaults: { values: Record<string, number>; source: string } | null;
  chatSampling: Record<string, number>;
}

export type ToWorker =
  | { kind: "load"; id: number; model: string; quantization?: string; baseUrl: string;
      protocol: string; version: string; // the client's build (PROTOCOL, VERSION)
      kvCacheBytes?: number; prefixCache?: boolean; cache?: boolean; stallTimeoutMs?: number; apiKey?: string;
      speculative?: { method: string; numTokens?: number; model?: string; quantization?: string };
      backend?: Backend; relaxedSimd?: boolean;
      clientLock?: string } // a Web Lock the client holds while it lives (SharedWorker clients)
  | { kind: "create"; id: number; api: Api; body: string }
  | { kind: "abort"; id: number } // the AbortSignal of request `id` fired
  | { kind: "abortAll"; id: number } // engine.abortAll()
  | { kind: "stats"; id: number }
  | { kind: "unload"; id: number } // this client is done; a shared engine stays loaded
  | { kind: "detach"; id: number }; // the client is gone (no answer)

export type FromWorker =
  | { kind: "progress"; id: number; progress: Progress }
  // hostLock: a Web Lock a SharedWorker holds while it lives (a client granted it knows the
  // worker is gone: crashed or killed, which a MessagePort never reports)
  | { kind: "loaded"; id: number; info: EngineInfo; hostLock?: string }
  | { kind: "result"; id: number; data: string } // JSON of a ChatCompletion / Completion
  | { kind: "chunk"; id: number; data: string } // JSON of one chunk
  | { kind: "done"; id: number }
  | { kind: "ok"; id: number; data?: string }
  | { kind: "error"; id: number; error: ErrorPayload };

/** The chrome.runtime port name of the Chrome extension's engine. */
export const PORT_NAME = "wick-engine";
