/**
 * The engine's dedicated Web Worker: boots Pyodide (from wick's own origin, no CDN), installs
 * the engine wheel and its pure-Python dependencies offline, opens WebGPU (executor.ts), loads
 * the artifact (loader.ts: manifest, kernels, tokenizer and the first shards while Python boots,
 * then the engine allocates the weight buffers and the verified shards stream into them) and
 * runs the SAME Python engine
 * (wick.engine) with wasm/wick_web as glue.
 * It answers the typed protocol of worker_protocol.ts, for one client or many: a dedicated
 * Worker serves the page that made it (and any MessagePort handed to it with `connect`, as the
 * extension's offscreen document does for each chrome.runtime port); a SharedWorker serves every
 * tab of its origin. Clients of one engine share its model and its steps (hub.ts).
 */

import { Executor } from "./executor.js";
import { WasmExecutor } from "./wasm_executor.js";
import {
  ErrorPayload, WickError, missingFeature, modelNotFound, payload,
} from "./errors.js";
import { createGrammar } from "./grammar.js";
import { ArtifactLoader, Failure, fetchOk, newStats, sha256Hex } from "./loader.js";
import type { FileSpec } from "./loader.js";
import { Hub } from "./hub.js";
import { kernelSetFiles } from "./kernel_sets.js";
import { answersTo, modelNames } from "./model_names.js";
import type { Post } from "./hub.js";
import { PROTOCOL, VERSION } from "./worker_protocol.js";
import type { Backend, EngineInfo, FromWorker, Progress, ToWorker } from "./worker_protocol.js";

const MANIFEST = "wick-artifact.json";
const PREPARE_POLL_MS = 1000; // how often to ask whether the host finished a variant for us

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Any = any;

let host: Any = null; // wick_web.host.Host (a PyProxy)
let executor: Executor | WasmExecutor | null = null;
let draftExecutor: Executor | WasmExecutor | null = null; // a draft model's (speculative)
let pyodide: Any = null;

function toPayload(e: unknown): ErrorPayload {
  if (e instanceof Failure) return e.p;
  if (e instanceof WickError) return { error: e.error, status: e.status, class: e.name };
  const err = e as Error & { wickCode?: string };
  if (err?.wickCode === "no_webgpu" || err?.wickCode === "no_adapter") {
    return payload("WebGPUUnavailableError", err.message + ", and { backend: \"webgpu\" } asks " +
      "for it: leave backend out (or \"wasm\") to run the WebAssembly kernels on the CPU.",
      "device_error", err.wickCode, 500);
  }
  if (err?.wickCode === "no_wasm_simd") {
    return payload("WebGPUUnavailableError", `${err.message}; with neither a WebGPU adapter nor ` +
      "WebAssembly SIMD this browser cannot run the engine.", "device_error", err.wickCode, 500);
  }
  const msg = err?.message ?? String(e);
  // a Python exception that escaped the host's own handling
  return payload("WickError", msg, "internal_error", null, 500);
}

// ------------------------------------------------------------------------ boot

interface WasmManifest {
  wheels: { file: string; sha256: string }[];
  pyodide: string;
  tokenizers: string;
  xgrammar: string;
}

let xgrammarUrl = ""; // web-xgrammar's bundle, imported on the first request with a grammar

/** Where Pyodide, the wheels and the tokenizer library are: the wick host's /static/wasm/,
 * or, in the Chrome extension, its own packaged /wasm/ (MV3 runs no remote code). */
function runtimeUrl(base: string): string {
  if (location.protocol === "chrome-extension:") return new URL("/wasm/", location.href).href;
  return `${base}/static/wasm/`;
}

// Python's memory after the engine is imported, saved once per runtime build (the manifest
// names Pyodide and every wheel by content): a later start restores it in ~0.5 s instead of
// booting Pyodide and importing the engine (~2.7 s on a 2-core machine). Pyodide's memory
// snapshot (its `_makeSnapshot` / `_loadSnapshot` options) holds the interpreter and its
// modules; the wheels' files are unpacked again (they live outside that memory), for imports
// made later.
const RUNTIME_CACHE = "wick-runtime-v1";
let booted: EngineInfo["python"] = { ms: 0, from: "scratch" };

async function cachedSnapshot(url: string): Promise<Uint8Array | null> {
  try {
    const hit = await (await caches.open(RUNTIME_CACHE)).match(url);
    return hit ? new Uint8Array(await hit.arrayBuffer()) : null;
  } catch { // no Cache API here (an opaque origin): start from scratch
    return null;
  }
}

/** Keep `snapshot` as the one snapshot of this origin (older runtimes' are dropped). */
async function keepSnapshot(url: string, snapshot: Uint8Array<ArrayBuffer>): Promise<void> {
  try {
    const cache = await caches.open(RUNTIME_CACHE);
    for (const old of await cache.keys()) if (old.url !== url) await cache.delete(old);
    await cache.put(url, new Response(snapshot, { headers: { "Content-Type": "application/octet-stream" } }));
  } catch (e) { // (quota: the next start boots from scratch again)
    console.warn(`wick: Python's start-up snapshot was not kept: ${(e as Error).message}`);
  }
}

async function boot(base: string, progress: (p: Progress) => void, useCache: boolean): Promise<void> {
  if (pyodide) return;
  const t0 = performance.now();
  const wasm = runtimeUrl(base);
  const manText = await (await fetchOk(`${wasm}manifest.json`, "wasm manifest", { cache: "no-cache" })).text();
  const man = JSON.parse(manText) as WasmManifest;
  progress({ stage: "boot", loaded: 0, total: 3, text: "starting Python (Pyodide)" });
  const tokLib = import(/* webpackIgnore: true */ `${wasm}${man.tokenizers}`);
  xgrammarUrl = `${wasm}${man.xgrammar}`;
  const snapshotUrl = `${wasm}snapshot-${(await sha256Hex(new TextEncoder().encode(manText))).slice(0, 16)}.bin`;
  const snapshot = useCache ? await cachedSnapshot(snapshotUrl) : null;
  const wheels = Promise.all(man.wheels.map(async (w) => {
    const buf = new Uint8Array(await (await fetchOk(`${wasm}${w.file}`, "wheel")).arrayBuffer());
    if ((await sha256Hex(buf)) !== w.sha256) {
      throw new Failure(payload("LoadError", `${w.file}: corrupt (sha256 mismatch)`, "load_error", "corrupt_asset", 500));
    }
    return buf;
  }));
  const { loadPyodide } = await import(/* webpackIgnore: true */ `${wasm}${man.pyodide}pyodide.mjs`);
  const options = { indexURL: `${wasm}${man.pyodide}`, fullStdLib: false };
  let py: Any = null;
  if (snapshot) {
    try {
      py = await loadPyodide({ ...options, _loadSnapshot: snapshot });
    } catch (e) { // a snapshot this Pyodide cannot restore: start from scratch, make a new one
      console.warn(`wick: Python's start-up snapshot did not restore (${(e as Error).message}); starting from scratch`);
    }
  }
  const restored = py !== null;
  py ??= await loadPyodide({ ...options, _makeSnapshot: useCache });
  progress({ stage: "boot", loaded: 1, total: 3, text: "installing the wick engine" });
  for (const buf of await wheels) py.unpackArchive(buf, "wheel");
  if (!restored) {
    py.runPython("import wick.engine, wick_web.host, jinja2");
    // (before any JS object reaches Python: the snapshot holds none)
    if (useCache) void keepSnapshot(snapshotUrl, py.makeMemorySnapshot());
  }
  await tokLib;
  progress({ stage: "boot", loaded: 2, total: 3, text: "Python ready" });
  pyodide = py;
  booted = { ms: Math.round(performance.now() - t0), from: restored ? "snapshot" : "scratch" };
}

// ------------------------------------------------------------------------ models

interface ModelEntry {
  id: string; // artifact id
  model: string;
  quantization: string;
  features: string[];
  fallback?: string[]; // variants of the same weights that need none of `features` (compiler)
  kernel_sets?: string[]; // the manifest's kernel sets (`wick compile --kernel-sets` leaves some out)
}

/** Whether `entry` has the kernel set `exe` runs (an index without the list: assumed). */
const hasKernelSet = (entry: ModelEntry, exe: Executor | WasmExecutor): boolean =>
  !entry.kernel_sets?.length ||
  (exe instanceof WasmExecutor ? exe.libraries : ["webgpu"]).some((k) => entry.kernel_sets!.includes(k));

/** The entry of `models` to load on `exe`: one it has the features for, preferring one with
 * its kernel set, then its float width. */
function pickModel(models: ModelEntry[], model: string, quantization: string | undefined,
                   exe: Executor | WasmExecutor): ModelEntry {
  const features = exe.features;
  const named = models.filter((m) => answersTo(model, m));
  const choices = quantization ? named.filter((m) => m.quantization === quantization) : named;
  if (!choices.length) {
    const avail = [...new Set(models.map((m) => modelNames(m.model, m.quantization)[1]))];
    const what = quantization && named.length ? modelNames(model, quantization)[1] : model;
    throw new Failure(modelNotFound(what, avail));
  }
  const runnable = choices.filter((m) => m.features.every((f) => features.includes(f)));
  if (!runnable.length) {
    const m = choices[0];
    const missing = m.features.find((f) => !features.includes(f))!;
    // the variants of this model the server offers that need no optional feature, smallest
    // weights first (q4, q8, then q0 = unquantized)
    const bits = (q: string) => Number(q.match(/^q(\d+)/)?.[1] ?? 0) || 32;
    const variants = [...new Set(named.filter((n) => !n.features.length).map((n) => n.quantization))]
      .sort((a, b) => bits(a) - bits(b));
    throw new Failure(missingFeature(missing, variants.length ? variants : m.fallback ?? [],
      `${m.model} ${m.quantization}`));
  }
  // an artifact with this executor's kernel set before one without (compiled with
  // `--kernel-sets`); then f16 variants when the device has shader-f16 (a GPU), f32 ones on the
  // CPU (wasm: f32 is its native width); else the first listed
  const preferF32 = exe instanceof WasmExecutor;
  const rank = (m: ModelEntry) => (hasKernelSet(m, exe) ? 0 : 2) +
    (m.features.includes("shader-f16") !== preferF32 ? 0 : 1);
  return runnable.sort((a, b) => rank(a) - rank(b))[0];
}

// ------------------------------------------------------------------------ load

interface PreparingEntry {
  model: string;
  quantization: string;
  features: string[];
  stage?: string;
  done?: number;
  total?: number;
  error?: string;
}

/** The artifact to load: picked from the host's index; while the host is still compiling a
 * variant this device can run (a browser without shader-f16 beside a served f16 model), its
 * progress is reported and the index asked again until it is there. */
async function resolveEntry(base: string, msg: Extract<ToWorker, { kind: "load" }>,
                            exe: Executor | WasmExecutor, auth: Record<string, string>,
                            progress: (p: Progress) => void): Promise<ModelEntry> {
  const features = exe.features;
  for (;;) {
    const index = (await (await fetchOk(`${base}/web/models.json`, "model index",
      { cache: "no-cache", headers: auth })).json()) as
      { data: ModelEntry[]; preparing?: PreparingEntry[]; loading?: boolean };
    try {
      return pickModel(index.data, msg.model, msg.quantization, exe);
    } catch (e) {
      const wanted = (index.preparing ?? []).find((p) =>
        modelNames(p.model, p.quantization).includes(msg.model) &&
        (!msg.quantization || p.quantization === msg.quantization) &&
        p.features.every((f) => features.includes(f)));
      if (!wanted) {
        if (!index.loading) throw e;
        progress({ stage: "prepare", loaded: 0, total: 0, text: "the server is still loading its models" });
        await new Promise((r) => setTimeout(r, PREPARE_POLL_MS));
        continue;
      }
      if (wanted.error) {
        throw new Failure(payload("LoadError", `the server could not build ${wanted.model} ` +
          `${wanted.quantization} for this browser: ${wanted.error}`, "load_error", "variant_failed", 503));
      }
      progress({ stage: "prepare", loaded: wanted.done ?? 0, total: wanted.total ?? 0,
        text: `the server is compiling ${wanted.model} ${wanted.quantization} for this browser: ${wanted.stage ?? ""}` });
      await new Promise((r) => setTimeout(r, PREPARE_POLL_MS));
    }
  }
}

/** The executor `backend` asks for. "auto": WebGPU on a hardware adapter, else the WebAssembly
 * kernels (no WebGPU, no adapter, or a software one such as SwiftShader: the CPU runs wick's
 * CPU kernels far faster than a GPU emulated on it). */
async function openExecutor(backend: Backend, relaxedSimd: boolean): Promise<Executor | WasmExecutor> {
  if (backend === "wasm") return WasmExecutor.create(undefined, relaxedSimd);
  try {
    const gpu = await Executor.create();
    if (backend === "webgpu" || !gpu.fallback) return gpu;
    gpu.destroy();
  } catch (e) {
    if (backend === "webgpu") throw e;
  }
  return WasmExecutor.create(undefined, relaxedSimd);
}

/** The executor and the artifact for `msg`: on "auto", a variant the GPU lacks a feature for
 * (e.g. q4f16_1 without shader-f16) runs on the WebAssembly kernels instead. */
async function openAndResolve(base: string, msg: Extract<ToWorker, { kind: "load" }>,
                              auth: Record<string, string>, progress: (p: Progress) => void):
    Promise<[Executor | WasmExecutor, ModelEntry]> {
  const backend = msg.backend ?? "auto";
  const relaxedSimd = msg.relaxedSimd !== false;
  let exe = executor;
  // a WebAssembly executor holds one model's kernels and buffers: a new load gets a new one;
  // so does a load asking for the other backend
  if (exe && (exe instanceof WasmExecutor || backend === "wasm")) {
    dropExecutors();
    exe = null;
  }
  exe ??= await openExecutor(backend, relaxedSimd);
  const wasm = exe instanceof WasmExecutor;
  let entry: ModelEntry;
  try {
    entry = await resolveEntry(base, msg, exe, auth, progress);
  } catch (e) {
    if (backend !== "auto" || wasm || !(e instanceof Failure) || e.p.error.code !== "missing_device_feature") throw e;
    exe.destroy();
    executor = null;
    const cpu = await WasmExecutor.create(undefined, relaxedSimd);
    return [cpu, await resolveEntry(base, msg, cpu, auth, progress)];
  }
  if (backend !== "auto" || hasKernelSet(entry, exe)) return [exe, entry];
  // compiled without this executor's kernel set (`wick compile --kernel-sets`): the other
  // backend, where the artifact has its set (WebGPU on any adapter, a software one included);
  // else the engine refuses it with the option to compile it with
  const other = await (wasm ? Executor.create() : WasmExecutor.create(undefined, relaxedSimd))
    .catch(() => null);
  if (other) {
    const again = await resolveEntry(base, msg, other, auth, progress).catch(() => null);
    if (again && hasKernelSet(again, other)) {
      exe.destroy();
      executor = null;
      return [other, again];
    }
    other.destroy();
  }
  return [exe, entry];
}

/** One artifact's part of a load before its engine exists: the manifest and the small files
 * (verified), and the loader that streams its shards into the engine's buffers afterwards. */
interface Fetched {
  entry: ModelEntry;
  manifest: Any;
  files: Map<string, Uint8Array>;
  loader: ArtifactLoader;
  kernels: number; // kernel files among them
}

async function fetchArtifact(base: string, entry: ModelEntry, exe: Executor | WasmExecutor,
                             msg: Extract<ToWorker, { kind: "load" }>, auth: Record<string, string>,
                             stats: ReturnType<typeof newStats>, progress: (p: Progress) => void,
                             withTokenizer: boolean): Promise<Fetched> {
  const root = `${base}/artifacts/${encodeURIComponent(entry.id)}`;
  const manBytes = new Uint8Array(await (await fetchOk(`${root}/${MANIFEST}`, MANIFEST,
    { cache: "no-cache", headers: auth })).arrayBuffer());
  const manifest = JSON.parse(new TextDecoder().decode(manBytes));
  const loader = new ArtifactLoader(root, msg.cache !== false, stats, progress, msg.stallTimeoutMs, auth);
  loader.prefetch(shardSpecs(manifest)); // the weights come meanwhile too (Python may be booting)
  // the kernel set of this executor (the manifest's kernel_sets[kind]: WGSL files, or the one
  // WebAssembly module); an artifact without it, or of another format, is refused by the
  // engine with a "recompile" message
  const wasm = exe instanceof WasmExecutor;
  if (wasm) exe.fitLibrary(Object.keys(manifest.kernel_sets ?? {}));
  const set = manifest.kernel_sets?.[wasm ? exe.library : "webgpu"];
  const kernelFiles: Any[] = set ? kernelSetFiles(set) : [];
  const library = wasm && set ? set : null;
  const files = await loader.files([
    ...(withTokenizer ? [{ file: manifest.tokenizer.file, sha256: manifest.tokenizer.sha256 }] : []),
    ...kernelFiles.map((k: Any) => ({ file: k.file, sha256: k.sha256 })),
  ]);
  // (the kernel module compiles off this thread meanwhile: Python may still be booting)
  if (library) await (exe as WasmExecutor).prepare(library.sha256, files.get(library.file)! as Uint8Array<ArrayBuffer>);
  files.set(MANIFEST, manBytes);
  return { entry, manifest, files, loader, kernels: kernelFiles.length };
}

const shardSpecs = (manifest: Any): FileSpec[] =>
  manifest.shards.map((s: Any) => ({ file: s.file, sha256: s.sha256, nbytes: s.nbytes }));

/** Each verified shard of `art` straight into the buffers its engine allocated (`placements`:
 * JSON `[[shard, offset, nbytes, buffer], ...]` of the host). */
async function streamShards(art: Fetched, placements: string, exe: Executor | WasmExecutor): Promise<void> {
  const byShard = new Map<number, number[][]>();
  for (const w of JSON.parse(placements) as number[][]) {
    if (!byShard.has(w[0])) byShard.set(w[0], []);
    byShard.get(w[0])!.push(w);
  }
  await art.loader.shards(shardSpecs(art.manifest), async (i, data) => {
    for (const [, offset, nbytes, buffer] of byShard.get(i) ?? []) {
      exe.write(buffer, 0, data.subarray(offset, offset + nbytes));
    }
    await exe.drain(); // let the device take the bytes before the next shard arrives
  });
}

/** The draft model of createEngine's `speculative: {method: "draft"}` (null without one):
 * found in the host's index like the model (default: the model itself in its 4-bit twin, as
 * the engine decides), on an executor of its own when the model runs on WebAssembly (an
 * executor holds one kernel module and the memory its buffers live in; the draft's runs on
 * one thread), else on the model's WebGPU device. */
async function fetchDraft(base: string, msg: Extract<ToWorker, { kind: "load" }>, entry: ModelEntry,
                          exe: Executor | WasmExecutor, auth: Record<string, string>,
                          stats: ReturnType<typeof newStats>, progress: (p: Progress) => void):
    Promise<[Fetched, Executor | WasmExecutor] | null> {
  const mod = pyodide.pyimport("wick_web.host");
  let wanted: { model: string; quantization: string; error?: ErrorPayload } | null;
  try {
    wanted = JSON.parse(mod.draft_wanted(msg.speculative ? JSON.stringify(msg.speculative) : "",
      entry.model));
  } finally {
    mod.destroy();
  }
  if (!wanted) return null;
  if (wanted.error) throw new Failure(wanted.error);
  const wasm = exe instanceof WasmExecutor;
  // (one thread: its steps alternate with the model's, whose helper threads spin between
  // jobs; a second pool of helpers would fight them for the same cores)
  const draftExe = wasm ? await WasmExecutor.create(1, msg.relaxedSimd !== false) : exe;
  try {
    let draftEntry: ModelEntry;
    try {
      draftEntry = await resolveEntry(base, { ...msg, model: wanted.model, quantization: wanted.quantization },
        draftExe, auth, progress);
    } catch (e) {
      if (!(e instanceof Failure)) throw e;
      throw new Failure({ ...e.p, error: { ...e.p.error, param: "speculative",
        message: `the draft model (speculative: {method: "draft"}): ${e.p.error.message}` } });
    }
    return [await fetchArtifact(base, draftEntry, draftExe, msg, auth, stats, progress, false), draftExe];
  } catch (e) {
    if (draftExe !== exe) draftExe.destroy();
    throw e;
  }
}

/** Load the model `msg` names; `post` routes the engine's answers to request ids. */
async function load(msg: Extract<ToWorker, { kind: "load" }>, progress: (p: Progress) => void,
                    post: Post): Promise<EngineInfo> {
  const base = msg.baseUrl.replace(/\/$/, "");
  const auth: Record<string, string> = msg.apiKey ? { Authorization: `Bearer ${msg.apiKey}` } : {};
  const stats = newStats();
  dropDraftExecutor(); // (a load that failed half-way)
  // the model's manifest, tokenizer and kernels (compiled, on wasm) while Python boots
  const [, [exe, entry, art]] = await Promise.all([boot(base, progress, msg.cache !== false),
    openAndResolve(base, msg, auth, progress).then(async ([exe, entry]) => {
      executor = exe; // (kept, or destroyed by the next load, if what follows fails)
      return [exe, entry, await fetchArtifact(base, entry, exe, msg, auth, stats, progress, true)] as const;
    })]);
  const wasm = exe instanceof WasmExecutor;
  let draft: Fetched | null = null;
  const withDraft = await fetchDraft(base, msg, entry, exe, auth, stats, progress);
  if (withDraft) [draft, draftExecutor] = withDraft;
  const { manifest, files } = art;

  const tokenizers = (globalThis as Any).tokenizers;
  const tk = await tokenizers.Tokenizer.fromJSON(files.get(manifest.tokenizer.file)!.slice().buffer);
  const jsTokenizer = {
    vocabSize: tk.getVocabSize(),
    encodeCsv: (text: string) => Array.from(tk.encode(text) as Int32Array).join(","),
    decodeCsv: (csv: string) => tk.decode(Int32Array.from(csv.split(",").map(Number))),
  };
  progress({ stage: "compile", loaded: 0, total: art.kernels + (draft?.kernels ?? 0),
    text: wasm ? "compiling WebAssembly kernels" : "compiling kernels" });
  try {
    const mod = pyodide.pyimport("wick_web.host");
    try {
      // kernels compiled, weight buffers allocated (empty), tokenizer and engine built; a
      // failure comes back as an error payload (data), not as an exception
      const grammar = (vocab: string[], type: number, prefix: boolean, size: number, stops: number[]) =>
        createGrammar(xgrammarUrl, vocab, type, prefix, size, stops);
      const loaded = await mod.load(exe, jsTokenizer, (path: string) => files.get(path) ?? null, post,
        msg.kvCacheBytes ?? 0, grammar, msg.prefixCache ?? true,
        msg.speculative ? JSON.stringify(msg.speculative) : "",
        // (undefined, not null: Pyodide turns null into JsNull, undefined into None)
        draftExecutor === exe ? undefined : draftExecutor ?? undefined,
        draft ? (path: string) => draft!.files.get(path) ?? null : undefined);
      try {
        if (loaded.error) throw new Failure(JSON.parse(loaded.error));
        host = loaded.host.copy(); // (an attribute's proxy dies with its owner's)
      } finally {
        loaded.destroy();
      }
    } catch (e) {
      throw new Failure(pythonError(e));
    } finally {
      mod.destroy();
      files.clear();
      draft?.files.clear();
    }
    // weights: each verified shard straight into the buffers the engine allocated
    await streamShards(art, host.placements_json(), exe);
    if (draft) await streamShards(draft, host.placements_json(true), draftExecutor!);
    const failed = await host.ready(); // the first error of compiling, allocating or writing
    if (failed) throw new Failure(JSON.parse(failed));
  } catch (e) {
    // a half-loaded model is of no use: drop it, and the device with its buffers
    if (host) {
      try {
        await host.close();
      } catch { /* the error that brought us here is the one to report */ } finally {
        host.destroy();
        host = null;
      }
    }
    dropExecutors();
    art.loader.dispose();
    throw e;
  }
  progress({ stage: "ready", loaded: 1, total: 1, text: "ready" });
  return { model: manifest.model_id, quantization: manifest.quantization, artifactId: entry.id,
    backend: wasm ? "wasm" : "webgpu", device: exe.name, threads: wasm ? exe.threads : 0,
    features: exe.features, samplingDefaults: manifest.model.sampling_defaults ?? null,
    chatSampling: JSON.parse(host.chat_sampling_json()), ...stats, attached: false,
    protocol: PROTOCOL, version: VERSION, python: booted,
    draft: draft ? { model: draft.manifest.model_id, quantization: draft.manifest.quantization,
      artifactId: draft.entry.id } : null };
}

/** Forget the draft model's executor, destroying it when it is not the model's. */
function dropDraftExecutor(): void {
  if (draftExecutor && draftExecutor !== executor) draftExecutor.destroy();
  draftExecutor = null;
}

/** Destroy the executors (the draft model's too, when it has its own). */
function dropExecutors(): void {
  dropDraftExecutor();
  executor?.destroy();
  executor = null;
}

/** An exception out of Python is a bug (the host returns its errors as payloads): its last
 * line, as an internal error. */
function pythonError(e: unknown): ErrorPayload {
  if (e instanceof Failure) return e.p;
  const err = e as Error & { type?: string };
  if (err?.type && pyodide) {
    const lines = err.message.trim().split("\n");
    return payload("WickError", lines[lines.length - 1], "internal_error", null, 500);
  }
  return toPayload(e);
}

// ------------------------------------------------------------------------ engine

/** What the hub drives: the Python host and the executor of this worker. */
const engine = {
  load,
  start: (rid: number, api: string, body: string) => {
    if (!host) throw new Failure(payload("WickError", "no model is loaded", "engine_error", "not_loaded", 500));
    host.start(rid, api, body);
  },
  abort: (rid: number) => host?.abort(rid),
  abortAll: () => host?.abort_all(),
  stats: (): string => (host ? host.info_json() : "{}"),
  async unload(): Promise<void> {
    try {
      if (host) await host.close();
    } finally {
      host?.destroy();
      host = null;
      dropExecutors();
    }
  },
  toPayload: pythonError,
};

const hub = new Hub(engine);
// eslint-disable-next-line @typescript-eslint/no-explicit-any
const scope = self as any;
if ("onconnect" in scope) {
  // a SharedWorker: one connection per tab (or other context) of the origin; the model stays
  // while any tab lives (Chrome ends the worker with the origin's last tab)
  hub.keepLoaded = true;
  // held until this worker ends: its clients ask for it, and are granted it only then
  const lock = `wick-host-${crypto.randomUUID()}`;
  hub.hostLock = new Promise<string>((held) => {
    void navigator.locks.request(lock, () => { held(lock); return new Promise<never>(() => {}); });
  });
  scope.onconnect = (ev: MessageEvent) => {
    for (const port of ev.ports) hub.connect(port);
  };
} else {
  // a dedicated Worker: its page, plus the MessagePorts handed over with {kind: "connect"}
  hub.connect(scope as DedicatedWorkerGlobalScope, (m, ports) => {
    if (m.kind !== "connect") return false;
    hub.keepLoaded = true; // a bridge's (the extension's) engine outlives each of its clients
    for (const port of ports) hub.connect(port);
    return true;
  });
}
