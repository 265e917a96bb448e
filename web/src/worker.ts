/**
 * The engine's dedicated Web Worker: boots Pyodide (from wick's own origin, no CDN), installs
 * the engine wheel and its pure-Python dependencies offline, opens WebGPU (executor.ts), loads
 * the artifact (manifest, then every file verified by sha256 with crypto.subtle, cached with the
 * Cache API) and runs the SAME Python engine (wick.engine) with wasm/wick_web as glue.
 * It answers the typed protocol of worker_protocol.ts.
 */

import { Executor } from "./executor.js";
import {
  ErrorPayload, WickError, missingFeature, modelNotFound, payload,
} from "./errors.js";
import type { EngineInfo, FromWorker, Progress, ToWorker } from "./worker_protocol.js";

const CACHE_NAME = "wick-artifacts-v1";
const MANIFEST = "wick-artifact.json";

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Any = any;

const scope = self as unknown as DedicatedWorkerGlobalScope;
const send = (m: FromWorker) => scope.postMessage(m);

let host: Any = null; // wick_web.host.Host (a PyProxy)
let executor: Executor | null = null;
let pyodide: Any = null;

class Failure extends Error {
  constructor(readonly p: ErrorPayload) {
    super(p.error.message);
  }
}

function toPayload(e: unknown): ErrorPayload {
  if (e instanceof Failure) return e.p;
  if (e instanceof WickError) return { error: e.error, status: e.status, class: e.name };
  const err = e as Error & { wickCode?: string };
  if (err?.wickCode === "no_webgpu" || err?.wickCode === "no_adapter") {
    return payload("WebGPUUnavailableError", err.message + ". wick's browser engine needs WebGPU " +
      "(Chrome/Edge 113+, or Chromium with --enable-unsafe-webgpu); on a device without " +
      "shader-f16 use q4f32_1 or q0f32.", "device_error", err.wickCode, 500);
  }
  const msg = err?.message ?? String(e);
  // a Python exception that escaped the host's own handling
  return payload("WickError", msg, "internal_error", null, 500);
}

async function sha256Hex(data: Uint8Array | ArrayBuffer): Promise<string> {
  const d = await crypto.subtle.digest("SHA-256", data as BufferSource);
  return Array.from(new Uint8Array(d), (b) => b.toString(16).padStart(2, "0")).join("");
}

async function fetchOk(url: string, what: string, init?: RequestInit): Promise<Response> {
  let r: Response;
  try {
    r = await fetch(url, init);
  } catch (e) {
    throw new Failure(payload("LoadError", `${what}: could not fetch ${url}: ${(e as Error).message}`,
      "load_error", "network_error", 503));
  }
  if (!r.ok) {
    throw new Failure(payload("LoadError", `${what}: GET ${url} answered ${r.status}`, "load_error",
      "network_error", r.status));
  }
  return r;
}

// ------------------------------------------------------------------------ boot

interface WasmManifest {
  wheels: { file: string; sha256: string }[];
  pyodide: string;
  tokenizers: string;
}

async function boot(base: string, progress: (p: Progress) => void): Promise<void> {
  if (pyodide) return;
  const wasm = `${base}/static/wasm/`;
  const man = (await (await fetchOk(`${wasm}manifest.json`, "wasm manifest", { cache: "no-cache" })).json()) as WasmManifest;
  progress({ stage: "boot", loaded: 0, total: 3, text: "starting Python (Pyodide)" });
  const tokLib = import(/* webpackIgnore: true */ `${wasm}${man.tokenizers}`);
  const { loadPyodide } = await import(/* webpackIgnore: true */ `${wasm}${man.pyodide}pyodide.mjs`);
  const py = await loadPyodide({ indexURL: `${wasm}${man.pyodide}`, fullStdLib: false });
  progress({ stage: "boot", loaded: 1, total: 3, text: "installing the wick engine" });
  const wheels = await Promise.all(man.wheels.map(async (w) => {
    const buf = new Uint8Array(await (await fetchOk(`${wasm}${w.file}`, "wheel")).arrayBuffer());
    if ((await sha256Hex(buf)) !== w.sha256) {
      throw new Failure(payload("LoadError", `${w.file}: corrupt (sha256 mismatch)`, "load_error", "corrupt_asset", 500));
    }
    return buf;
  }));
  for (const buf of wheels) py.unpackArchive(buf, "wheel");
  py.runPython("import wick.engine, wick_web.host, jinja2");
  await tokLib;
  progress({ stage: "boot", loaded: 2, total: 3, text: "Python ready" });
  pyodide = py;
}

// ------------------------------------------------------------------------ models

interface ModelEntry {
  id: string; // artifact id
  model: string;
  quantization: string;
  features: string[];
}

function pickModel(models: ModelEntry[], model: string, quantization: string | undefined,
                   features: string[]): ModelEntry {
  const named = models.filter((m) => m.model === model || `${m.model}-${m.quantization}` === model ||
    m.id === model);
  const choices = quantization ? named.filter((m) => m.quantization === quantization) : named;
  if (!choices.length) {
    const avail = [...new Set(models.map((m) => `${m.model}-${m.quantization}`))];
    const what = quantization && named.length ? `${model}-${quantization}` : model;
    throw new Failure(modelNotFound(what, avail));
  }
  const runnable = choices.filter((m) => m.features.every((f) => features.includes(f)));
  if (!runnable.length) {
    const m = choices[0];
    const missing = m.features.find((f) => !features.includes(f))!;
    const variants = ["q4f32_1", "q0f32"].filter((q) => named.some((n) => n.quantization === q));
    throw new Failure(missingFeature(missing, variants.length ? variants : ["q4f32_1", "q0f32"],
      `${m.model} ${m.quantization}`));
  }
  // prefer f16 variants when the device has shader-f16, else the first listed
  const rank = (m: ModelEntry) => (m.features.includes("shader-f16") ? 0 : 1);
  return runnable.sort((a, b) => rank(a) - rank(b))[0];
}

// ------------------------------------------------------------------------ artifact files

interface FileSpec { file: string; sha256: string; nbytes?: number; shard?: boolean }

interface LoadStats { shardRequests: number; shardsFromCache: number; shardsRefetched: number }

async function loadFiles(root: string, specs: FileSpec[], useCache: boolean, stats: LoadStats,
                         progress: (p: Progress) => void): Promise<Map<string, Uint8Array>> {
  const cache = useCache && "caches" in self ? await caches.open(CACHE_NAME) : null;
  const total = specs.reduce((s, f) => s + (f.nbytes ?? 0), 0);
  let loaded = 0;
  const files = new Map<string, Uint8Array>();
  let quotaWarned = false;
  const report = (text: string) => progress({ stage: "download", loaded, total, text });
  // a few files at a time: shards are large, kernels many and small
  const queue = [...specs];
  const worker = async () => {
    for (let spec = queue.shift(); spec; spec = queue.shift()) {
      const url = `${root}/${spec.file}`;
      let data: Uint8Array | null = null;
      if (cache) {
        const hit = await cache.match(url);
        if (hit) {
          const buf = new Uint8Array(await hit.arrayBuffer());
          if ((await sha256Hex(buf)) === spec.sha256) {
            data = buf;
            if (spec.shard) stats.shardsFromCache++;
          } else {
            await cache.delete(url); // corrupt entry: drop it and download again
            if (spec.shard) stats.shardsRefetched++;
            progress({ stage: "cache", loaded, total, text: `${spec.file}: cached copy is corrupt, downloading it again` });
          }
        }
      }
      if (!data) {
        if (spec.shard) stats.shardRequests++;
        const r = await fetchOk(url, spec.file);
        const buf = new Uint8Array(await r.arrayBuffer());
        if ((await sha256Hex(buf)) !== spec.sha256) {
          throw new Failure(payload("ArtifactError",
            `${root}/${spec.file}: corrupt (sha256 mismatch): re-download or recompile it`,
            "artifact_error", "artifact_corrupt", 500));
        }
        data = buf;
        if (cache) {
          try { // only verified bytes are ever cached: an interrupted load leaves no bad entry
            await cache.put(url, new Response(buf, { headers: { "Content-Type": "application/octet-stream" } }));
          } catch (e) {
            const name = (e as Error).name;
            if (!quotaWarned) {
              quotaWarned = true;
              progress({ stage: "cache", loaded, total, text: name === "QuotaExceededError"
                ? `cache quota exceeded: ${spec.file} and later files are not cached (${(e as Error).message})`
                : `could not cache ${spec.file}: ${(e as Error).message}` });
            }
          }
        }
      }
      files.set(spec.file, data);
      loaded += spec.nbytes ?? 0; // total counts the weight shards (the bytes that matter)
      report(spec.file);
    }
  };
  await Promise.all(Array.from({ length: 4 }, worker));
  return files;
}

// ------------------------------------------------------------------------ load

async function load(msg: Extract<ToWorker, { kind: "load" }>): Promise<EngineInfo> {
  const base = msg.baseUrl.replace(/\/$/, "");
  const progress = (p: Progress) => send({ kind: "progress", id: msg.id, progress: p });
  const [, exe, index] = await Promise.all([
    boot(base, progress),
    executor ? Promise.resolve(executor) : Executor.create(),
    fetchOk(`${base}/web/models.json`, "model index", { cache: "no-cache" }).then((r) => r.json()),
  ]);
  executor = exe;
  const entry = pickModel((index as { data: ModelEntry[] }).data, msg.model, msg.quantization, exe.features);
  const root = `${base}/artifacts/${encodeURIComponent(entry.id)}`;
  const manBytes = new Uint8Array(await (await fetchOk(`${root}/${MANIFEST}`, MANIFEST, { cache: "no-cache" })).arrayBuffer());
  const manifest = JSON.parse(new TextDecoder().decode(manBytes));
  const specs: FileSpec[] = [
    { file: manifest.tokenizer.file, sha256: manifest.tokenizer.sha256 },
    ...manifest.kernels.map((k: Any) => ({ file: k.file, sha256: k.sha256 })),
    ...manifest.shards.map((s: Any) => ({ file: s.file, sha256: s.sha256, nbytes: s.nbytes, shard: true })),
  ];
  const stats: LoadStats = { shardRequests: 0, shardsFromCache: 0, shardsRefetched: 0 };
  const files = await loadFiles(root, specs, msg.cache !== false, stats, progress);
  files.set(MANIFEST, manBytes);

  const tokenizers = (globalThis as Any).tokenizers;
  const tk = await tokenizers.Tokenizer.fromJSON(files.get(manifest.tokenizer.file)!.slice().buffer);
  const jsTokenizer = {
    vocabSize: tk.getVocabSize(),
    encodeCsv: (text: string) => Array.from(tk.encode(text) as Int32Array).join(","),
    decodeCsv: (csv: string) => tk.decode(Int32Array.from(csv.split(",").map(Number))),
  };
  const shardFiles = new Set(manifest.shards.map((s: Any) => s.file));
  const getFile = (path: string) => {
    const f = files.get(path);
    if (f && shardFiles.has(path)) files.delete(path); // uploaded once: let it go
    return f ?? null;
  };
  const post = (rid: number, kind: string, data: string) => {
    if (kind === "error") send({ kind: "error", id: rid, error: JSON.parse(data) });
    else if (kind === "done") send({ kind: "done", id: rid });
    else send({ kind: kind as "result" | "chunk", id: rid, data });
  };
  const onUpload = (stage: string, done: number, total: number) =>
    progress({ stage: "upload", loaded: done, total, text: stage });
  const mod = pyodide.pyimport("wick_web.host");
  try {
    host = await mod.load(exe, jsTokenizer, getFile, post, msg.kvCacheBytes ?? 0, onUpload);
  } catch (e) {
    throw new Failure(pythonError(e));
  } finally {
    mod.destroy();
  }
  progress({ stage: "ready", loaded: 1, total: 1, text: "ready" });
  return { model: manifest.model_id, quantization: manifest.quantization, artifactId: entry.id,
    device: exe.name, features: exe.features, ...stats };
}

/** A Python exception from the host: WickErrors carry their payload as JSON in the message. */
function pythonError(e: unknown): ErrorPayload {
  const err = e as Error & { type?: string };
  if (err?.type && pyodide) {
    try {
      const m = /(\{"error":.*\})\s*$/s.exec(err.message);
      if (m) return JSON.parse(m[1]);
    } catch { /* fall through */ }
    const lines = err.message.trim().split("\n");
    return payload("WickError", lines[lines.length - 1], "internal_error", null, 500);
  }
  return toPayload(e);
}

// ------------------------------------------------------------------------ messages

scope.onmessage = async (ev: MessageEvent<ToWorker>) => {
  const msg = ev.data;
  try {
    switch (msg.kind) {
      case "load": {
        const info = await load(msg);
        send({ kind: "loaded", id: msg.id, info });
        break;
      }
      case "create":
        if (!host) throw new Failure(payload("WickError", "no model is loaded", "engine_error", "not_loaded", 500));
        host.start(msg.id, msg.api, msg.body);
        break;
      case "cancel":
        host?.cancel(msg.id);
        break;
      case "interrupt":
        host?.interrupt();
        send({ kind: "ok", id: msg.id });
        break;
      case "stats":
        send({ kind: "ok", id: msg.id, data: host ? host.info_json() : "{}" });
        break;
      case "unload":
        if (host) {
          await host.close();
          host.destroy();
          host = null;
        }
        executor?.destroy();
        executor = null;
        send({ kind: "ok", id: msg.id });
        break;
    }
  } catch (e) {
    send({ kind: "error", id: msg.id, error: toPayload(e) });
  }
};
