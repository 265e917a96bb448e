/** The typed messages between the page (client.ts) and the engine's worker (worker.ts):
 * tagged unions on `kind`, every message carries the `id` of the call it belongs to. */

import type { ErrorPayload } from "./errors.js";

export interface Progress {
  // boot: Pyodide and the engine; prepare: the server is compiling a variant this device can
  // run (steps of its compile); compile: kernels into pipelines; download: weight bytes (from
  // the network or the cache) into GPU buffers; cache: a note on the browser cache
  stage: "boot" | "prepare" | "compile" | "download" | "cache" | "ready";
  loaded: number; // bytes (download) or steps done
  total: number;
  text: string;
}

export interface EngineInfo {
  model: string;
  quantization: string;
  artifactId: string;
  device: string;
  features: string[];
  shardRequests: number; // shards fetched over the network by this load
  shardsFromCache: number;
  shardsRefetched: number; // cached shards that failed sha256 and were downloaded again
  resumedRequests: number; // Range requests that continued a cut-off download
  cacheError: ErrorPayload | null; // the cache could not keep the files, e.g. its quota is exceeded
}

export type ToWorker =
  | { kind: "load"; id: number; model: string; quantization?: string; baseUrl: string;
      kvCacheBytes?: number; cache?: boolean; stallTimeoutMs?: number; apiKey?: string }
  | { kind: "create"; id: number; api: "chat" | "completion"; body: string }
  | { kind: "cancel"; id: number } // the AbortSignal of request `id` fired
  | { kind: "interrupt"; id: number }
  | { kind: "stats"; id: number }
  | { kind: "unload"; id: number };

export type FromWorker =
  | { kind: "progress"; id: number; progress: Progress }
  | { kind: "loaded"; id: number; info: EngineInfo }
  | { kind: "result"; id: number; data: string } // JSON of a ChatCompletion / Completion
  | { kind: "chunk"; id: number; data: string } // JSON of one chunk
  | { kind: "done"; id: number }
  | { kind: "ok"; id: number; data?: string }
  | { kind: "error"; id: number; error: ErrorPayload };
