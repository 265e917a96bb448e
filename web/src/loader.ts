/**
 * The artifact loader of the worker: every file of an artifact verified by sha256 before use,
 * cached with the browser Cache API, weight shards streamed one by one into GPU buffers.
 *
 * - Small files (tokenizer, kernels) come back as bytes for the Python engine.
 * - Shards are downloaded a few at a time, each straight into a buffer of its manifest size; a
 *   download cut off midway resumes with an HTTP Range request from the last byte received
 *   (the wick host answers 206), a few times with backoff; a sha256 mismatch is downloaded once
 *   more from scratch, then named as corrupt. Each verified shard goes to the `sink` (the GPU
 *   upload) and the cache, then is let go: the whole model is never in memory at once.
 * - Only verified bytes are cached, so an interrupted load leaves no bad entry; the shards that
 *   did finish stay cached, so the next load downloads only the rest. A cached copy that fails
 *   sha256 is dropped and downloaded again.
 * - A full cache (QuotaExceededError) does not fail the load: it is reported as a typed
 *   CacheQuotaError payload (`stats.cacheError`, and an onProgress "cache" event), and later
 *   files are not offered to the cache.
 */

import { ErrorPayload, payload } from "./errors.js";
import type { Progress } from "./worker_protocol.js";

export const CACHE_NAME = "wick-artifacts-v1";
const PARALLEL_SHARDS = 3;
const PARALLEL_FILES = 8;
// shards fetched ahead (`prefetch`: while Python boots) and held until the engine takes them
const PREFETCH_BYTES = 256 * 2 ** 20;
const RETRIES = 4; // further attempts after a network failure, per file
const BACKOFF_MS = 250;
export const STALL_MS = 30_000; // default: a download that sends nothing this long is cut and resumed
const LATE_MS = 250; // a stall timer this late was held up by a busy thread: look again first

export class Failure extends Error {
  constructor(readonly p: ErrorPayload) {
    super(p.error.message);
  }
}

export interface FileSpec { file: string; sha256: string; nbytes?: number }

export interface LoadStats {
  shardRequests: number; // shards downloaded (not from the cache) by this load
  shardsFetchedAhead: number; // shards whose fetch `prefetch` began before the engine asked
  shardsFromCache: number;
  shardsRefetched: number; // cached shards that failed sha256 and were downloaded again
  resumedRequests: number; // Range requests that continued a cut-off download
  cacheError: ErrorPayload | null; // e.g. the cache quota was exceeded
}

export const newStats = (): LoadStats => ({
  shardRequests: 0, shardsFetchedAhead: 0, shardsFromCache: 0, shardsRefetched: 0, resumedRequests: 0,
  cacheError: null,
});

export async function sha256Hex(data: Uint8Array | ArrayBuffer): Promise<string> {
  const d = await crypto.subtle.digest("SHA-256", data as BufferSource);
  return Array.from(new Uint8Array(d), (b) => b.toString(16).padStart(2, "0")).join("");
}

function loadError(message: string, code: string, status = 503): Failure {
  return new Failure(payload("LoadError", message, "load_error", code, status));
}

/** A network failure that trying again may cure (the download loop retries these). */
function retryable(message: string): Failure {
  return Object.assign(loadError(message, "network_error"), { retry: true });
}

function corrupt(url: string, why: string): Failure {
  return new Failure(payload("ArtifactError", `${url}: ${why}: the server's copy is damaged; ` +
    "compile the model again on the server (`wick compile` rebuilds a corrupt artifact)",
    "artifact_error", "artifact_corrupt", 500));
}

/** fetch that names what failed; a non-2xx answer is a Failure (the wick host's own error
 * when it sent one: a missing API key is an AuthenticationError), with `retry` set when trying
 * again may help (5xx, 408, 429). */
export async function fetchOk(url: string, what: string, init?: RequestInit): Promise<Response> {
  let r: Response;
  try {
    r = await fetch(url, init);
  } catch (e) {
    throw retryable(`${what}: could not fetch ${url}: ${(e as Error).message}`);
  }
  if (!r.ok) {
    let failure = loadError(`${what}: GET ${url} answered ${r.status}`, "network_error", r.status);
    try {
      const body = (await r.json()) as { error?: ErrorPayload["error"] };
      if (body?.error?.message) {
        const cls = r.status === 401 ? "AuthenticationError" : "LoadError";
        failure = new Failure({ error: { ...body.error, message: `${what}: ${body.error.message}` },
          status: r.status, class: cls });
      }
    } catch { /* not a wick error body: keep the status line */ }
    throw Object.assign(failure, { retry: r.status >= 500 || r.status === 408 || r.status === 429 });
  }
  return r;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class ArtifactLoader {
  private cache: Cache | null = null;
  private cacheWritable = true;
  private loaded = 0;
  private total = 0;
  private lastReport = 0;
  private ahead = new Map<string, Promise<Uint8Array>>(); // shard file -> its bytes, fetched ahead
  private counted = false; // (prefetch began the weights' progress count: shards() goes on with it)
  private disposed = false;

  constructor(private readonly root: string, private readonly useCache: boolean,
              readonly stats: LoadStats, private readonly progress: (p: Progress) => void,
              private readonly stallMs: number = STALL_MS,
              private readonly auth: Record<string, string> = {}) {}

  private async openCache(): Promise<Cache | null> {
    if (!this.cache && this.useCache && "caches" in self) {
      try {
        this.cache = await caches.open(CACHE_NAME);
      } catch (e) { // e.g. an opaque origin: no cache, the load still works
        this.cacheWritable = false;
        this.stats.cacheError = payload("ArtifactError", `the browser cache is unavailable: ${(e as Error).message}`,
          "artifact_error", "cache_unavailable", 500);
      }
    }
    return this.cache;
  }

  /** The small files, verified, by path. */
  async files(specs: FileSpec[]): Promise<Map<string, Uint8Array>> {
    const out = new Map<string, Uint8Array>();
    const queue = [...specs];
    const worker = async () => {
      for (let s = queue.shift(); s; s = queue.shift()) out.set(s.file, await this.get(s, false));
    };
    await Promise.all(Array.from({ length: PARALLEL_FILES }, worker));
    return out;
  }

  /** Start fetching the first shards of `specs` (up to PREFETCH_BYTES), a few at a time, while
   * the caller does something else (the worker: Python's first boot, ~2.5 s on a cold start,
   * during which the network would otherwise idle); `shards()` takes their verified bytes. */
  prefetch(specs: FileSpec[]): void {
    this.total = specs.reduce((s, f) => s + (f.nbytes ?? 0), 0);
    this.loaded = 0;
    this.counted = true;
    let budget = PREFETCH_BYTES;
    const lanes: Promise<unknown>[] = Array.from({ length: PARALLEL_SHARDS }, () => Promise.resolve());
    specs.forEach((spec, i) => {
      budget -= spec.nbytes ?? Infinity;
      if (budget < 0) return;
      const lane = i % PARALLEL_SHARDS;
      const bytes = lanes[lane].then(() => {
        if (this.disposed) throw loadError("the load ended", "aborted");
        return this.fetchFile(spec, true);
      });
      lanes[lane] = bytes.catch(() => undefined); // (each shard's failure is its own)
      bytes.catch(() => undefined); // (reported when shards() takes it; a load that ends first drops it)
      this.ahead.set(spec.file, bytes);
    });
  }

  /** A load that failed: shards fetched ahead are let go, and those not started are not. */
  dispose(): void {
    this.disposed = true;
    this.ahead.clear();
  }

  /** Every shard, verified, handed to `sink(index, bytes)` (awaited) then dropped. On a
   * failure, the shards already under way still finish (and are cached) before it is thrown. */
  async shards(specs: FileSpec[], sink: (index: number, data: Uint8Array) => Promise<void>): Promise<void> {
    if (!this.counted) {
      this.total = specs.reduce((s, f) => s + (f.nbytes ?? 0), 0);
      this.loaded = 0;
    }
    const queue = specs.map((s, i) => [i, s] as const);
    let failure: unknown = null;
    const worker = async () => {
      for (let item = queue.shift(); item && !failure; item = queue.shift()) {
        try {
          await sink(item[0], await this.get(item[1], true));
        } catch (e) {
          failure ??= e;
        }
      }
    };
    await Promise.all(Array.from({ length: PARALLEL_SHARDS }, worker));
    if (failure) throw failure;
    this.report("weights loaded", true);
  }

  private report(text: string, force = false, stage: Progress["stage"] = "download") {
    const now = Date.now();
    if (!force && now - this.lastReport < 100) return; // at most ~10 messages a second
    this.lastReport = now;
    this.progress({ stage, loaded: this.loaded, total: this.total, text });
  }

  private count(n: number, text: string) {
    this.loaded += n;
    this.report(text);
  }

  /** One file: fetched ahead, the cache if its copy verifies, else the network (then cached). */
  private async get(spec: FileSpec, shard: boolean): Promise<Uint8Array> {
    const early = shard ? this.ahead.get(spec.file) : undefined;
    if (early) {
      this.ahead.delete(spec.file);
      this.stats.shardsFetchedAhead++;
      return early;
    }
    return this.fetchFile(spec, shard);
  }

  private async fetchFile(spec: FileSpec, shard: boolean): Promise<Uint8Array> {
    const url = `${this.root}/${spec.file}`;
    const cache = await this.openCache();
    if (cache) {
      const hit = await cache.match(url);
      if (hit) {
        const buf = new Uint8Array(await hit.arrayBuffer());
        if ((await sha256Hex(buf)) === spec.sha256) {
          if (shard) {
            this.stats.shardsFromCache++;
            this.count(buf.byteLength, `${spec.file} (cached)`);
          }
          return buf;
        }
        await cache.delete(url); // a corrupt entry: drop it and download again
        if (shard) this.stats.shardsRefetched++;
        this.report(`${spec.file}: the cached copy is corrupt, downloading it again`, true, "cache");
      }
    }
    if (shard) this.stats.shardRequests++;
    let data = await this.download(url, spec, shard);
    if ((await sha256Hex(data)) !== spec.sha256) {
      if (shard) this.loaded -= data.byteLength;
      data = new Uint8Array(0); // let the bad copy go before the next one is allocated
      data = await this.download(url, spec, shard); // a transfer can go bad once: try again
      if ((await sha256Hex(data)) !== spec.sha256) {
        throw corrupt(url, "corrupt (sha256 mismatch after two downloads)");
      }
    }
    await this.put(url, data);
    return data;
  }

  private async put(url: string, data: Uint8Array): Promise<void> {
    if (!this.cache || !this.cacheWritable) return;
    try {
      await this.cache.put(url, new Response(data as BufferSource,
        { headers: { "Content-Type": "application/octet-stream" } }));
    } catch (e) {
      this.cacheWritable = false; // the rest would fail the same way
      if (this.stats.cacheError) return; // a put already under way failed first: say it once
      const err = e as Error;
      const quota = err.name === "QuotaExceededError";
      this.stats.cacheError = quota
        ? payload("CacheQuotaError", `the browser cache quota is exceeded: ${url} and later files are ` +
            `not cached and will be downloaded again next time (${err.message})`,
            "artifact_error", "cache_quota_exceeded", 507)
        : payload("ArtifactError", `could not cache ${url}: ${err.message}`, "artifact_error",
            "cache_write_failed", 500);
      this.report(this.stats.cacheError.error.message, true, "cache");
      console.warn(`wick: ${this.stats.cacheError.error.message}`);
    }
  }

  /** The bytes at `url`: with a known size, read into one buffer and resumed with Range
   * requests after a cut; a network failure, or no data for `stallMs`, is retried with backoff. */
  private async download(url: string, spec: FileSpec, shard: boolean): Promise<Uint8Array> {
    const size = spec.nbytes;
    const buf = size !== undefined ? new Uint8Array(size) : null;
    let got = 0;
    let etag: string | null = null;
    const restart = () => {
      if (shard) this.loaded -= got;
      got = 0;
    };
    for (let attempt = 0; ; attempt++) {
      const abort = new AbortController();
      let timer = 0;
      const watch = () => {
        clearTimeout(timer);
        let due = performance.now() + this.stallMs;
        const fire = () => {
          // A timer that fires late found this thread busy (Python's first boot runs on it,
          // seconds at a time), and data that came meanwhile may still be queued behind it:
          // silence is only silence once the stream has had a free moment to deliver it.
          const now = performance.now();
          if (now - due > LATE_MS) {
            due = now + LATE_MS;
            timer = setTimeout(fire, LATE_MS) as unknown as number;
            return;
          }
          abort.abort();
        };
        timer = setTimeout(fire, this.stallMs) as unknown as number;
      };
      const stalled = (e: unknown) => (abort.signal.aborted
        ? `no data for ${this.stallMs / 1000} s` : (e as Error).message);
      try {
        watch();
        const resume = buf !== null && got > 0;
        // no-store: the Cache API keeps the verified copy; the HTTP cache would keep a second one
        const headers: Record<string, string> = resume ? { ...this.auth, Range: `bytes=${got}-` }
          : { ...this.auth };
        if (resume && etag) headers["If-Range"] = etag; // a changed file comes back whole
        let r: Response;
        try {
          r = await fetchOk(url, spec.file, { cache: "no-store", headers, signal: abort.signal });
        } catch (e) {
          if (abort.signal.aborted) {
            throw retryable(`${spec.file}: ${stalled(e)}`);
          }
          throw e;
        }
        etag ??= r.headers.get("ETag");
        if (!buf) {
          try {
            return new Uint8Array(await r.arrayBuffer());
          } catch (e) {
            throw retryable(`${spec.file}: the download broke off: ${stalled(e)}`);
          }
        }
        if (resume) {
          const start = /^bytes (\d+)-/.exec(r.headers.get("Content-Range") ?? "");
          if (r.status === 206 && start && Number(start[1]) === got) {
            this.stats.resumedRequests++;
          } else if (r.status === 206) { // a range we did not ask for: ask again from 0
            restart();
            throw retryable(`${spec.file}: the server answered another range`);
          } else {
            restart(); // the server sent it all again: start over with this body
          }
        }
        if (!r.body) throw loadError(`${spec.file}: empty response body`, "network_error");
        const reader = r.body.getReader();
        for (;;) {
          let chunk: ReadableStreamReadResult<Uint8Array>;
          try {
            chunk = await reader.read();
          } catch (e) {
            throw retryable(`${spec.file}: the download broke off after ${got} of ${size} bytes: ` +
              stalled(e));
          }
          if (chunk.done) break;
          watch();
          if (got + chunk.value.byteLength > buf.byteLength) {
            abort.abort();
            throw corrupt(url, `longer than the ${size} bytes the manifest says`);
          }
          buf.set(chunk.value, got);
          got += chunk.value.byteLength;
          if (shard) this.count(chunk.value.byteLength, spec.file);
        }
        if (got === buf.byteLength) return buf;
        throw retryable(`${spec.file}: the download ended after ${got} of ${size} bytes`);
      } catch (e) {
        if (!(e as { retry?: boolean }).retry || attempt >= RETRIES) throw e;
        this.report(`${(e as Error).message}; retrying` +
          (got ? ` from byte ${got}` : ""), true);
        await sleep(BACKOFF_MS * 2 ** attempt);
      } finally {
        clearTimeout(timer);
      }
    }
  }
}
