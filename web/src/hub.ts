/**
 * The engine's side of the worker protocol for any number of clients (worker.ts owns the
 * engine; this routes to it). Each client is one message endpoint: the dedicated Worker's own
 * scope, a MessagePort of a SharedWorker, or a MessagePort the extension's offscreen document
 * bridges to a chrome.runtime port. Clients number their calls independently; the hub gives
 * every request an engine-wide id and sends each answer back to the client that asked.
 *
 * One model is loaded at a time; loads and unloads run one after another. A client asking for
 * the loaded model attaches to it (no downloads: `info.attached`); one asking while it loads
 * waits and sees the same progress; one asking for another model switches the engine only when
 * no other client is attached (else a typed ModelInUseError). Concurrent requests of all
 * clients share the engine's steps.
 */

import { payload } from "./errors.js";
import { newStats } from "./loader.js";
import { answersTo } from "./model_names.js";
import type { ErrorPayload } from "./errors.js";
import { PROTOCOL, VERSION, protocolMismatch } from "./worker_protocol.js";
import type { EngineInfo, FromWorker, Progress, ToWorker } from "./worker_protocol.js";

type LoadMessage = Extract<ToWorker, { kind: "load" }>;
/** The Python host's answers: (engine-wide request id, "result" | "chunk" | "done" | "error", JSON). */
export type Post = (rid: number, kind: string, data: string) => void;

/** What the hub drives (worker.ts: Pyodide's host and the WebGPU executor). */
export interface EngineOps {
  load(msg: LoadMessage, progress: (p: Progress) => void, post: Post): Promise<EngineInfo>;
  start(rid: number, api: string, body: string): void;
  abort(rid: number): void;
  abortAll(): void;
  stats(): string;
  unload(): Promise<void>;
  toPayload(e: unknown): ErrorPayload;
}

/** A message endpoint: DedicatedWorkerGlobalScope or MessagePort. */
export interface Endpoint {
  postMessage(m: FromWorker): void;
  onmessage: ((ev: MessageEvent) => unknown) | null;
}

class Client {
  readonly requests = new Map<number, number>(); // the client's request id -> engine-wide id
  attached = false;
  gone = false;
  constructor(private readonly end: Endpoint) {}
  send(m: FromWorker): void {
    if (!this.gone) this.end.postMessage(m);
  }
}

export class Hub {
  /** Keep the model loaded when its last client leaves (shared engines); a page's own worker
   * frees the GPU at once. */
  keepLoaded = false;
  /** The Web Lock this host holds while it lives, told to each client that loads (SharedWorker). */
  hostLock: Promise<string> | null = null;
  private readonly clients = new Set<Client>();
  private readonly routes = new Map<number, { client: Client; id: number }>();
  private nextRid = 0;
  // the loaded engine: where from, and its speculation (a client asking for other
  // speculation does not attach to it)
  private current: { base: string; info: EngineInfo; speculative: string } | null = null;
  private loading: { watchers: Set<(p: Progress) => void> } | null = null;
  private queue: Promise<unknown> = Promise.resolve();

  constructor(private readonly engine: EngineOps) {}

  /** Serve a client on `end`; `intercept` may take a message first (true: handled). */
  connect(end: Endpoint, intercept?: (m: ToWorker | { kind: "connect" }, ports: readonly MessagePort[]) => boolean): void {
    const client = new Client(end);
    this.clients.add(client);
    end.onmessage = (ev: MessageEvent) => {
      if (intercept?.(ev.data, ev.ports)) return;
      void this.handle(client, ev.data as ToWorker);
    };
  }

  /** The Python host's answers, routed back by engine-wide id. */
  private readonly post: Post = (rid, kind, data) => {
    const route = this.routes.get(rid);
    if (!route) return;
    const { client, id } = route;
    if (kind === "chunk") {
      client.send({ kind: "chunk", id, data });
      return;
    }
    this.routes.delete(rid);
    client.requests.delete(id);
    if (kind === "error") client.send({ kind: "error", id, error: JSON.parse(data) });
    else if (kind === "done") client.send({ kind: "done", id });
    else client.send({ kind: "result", id, data });
  };

  private async handle(client: Client, msg: ToWorker): Promise<void> {
    try {
      switch (msg.kind) {
        case "load": {
          // (a client of another build, older than this check, sends no protocol)
          if (msg.protocol !== PROTOCOL) throw protocolMismatch(msg.version ?? null, VERSION);
          const info = await this.attach(client, msg);
          const hostLock = this.hostLock ? await this.hostLock : undefined;
          client.send({ kind: "loaded", id: msg.id, info, ...(hostLock ? { hostLock } : {}) });
          // a tab of a SharedWorker holds this Web Lock while it lives: granted = it is gone
          if (msg.clientLock) void navigator.locks.request(msg.clientLock, () => this.leave(client));
          break;
        }
        case "create": {
          if (!client.attached) {
            throw payload("WickError", "no model is loaded", "engine_error", "not_loaded", 500);
          }
          const rid = ++this.nextRid;
          this.routes.set(rid, { client, id: msg.id });
          client.requests.set(msg.id, rid);
          try {
            this.engine.start(rid, msg.api, msg.body);
          } catch (e) {
            this.routes.delete(rid);
            client.requests.delete(msg.id);
            throw e;
          }
          break;
        }
        case "abort": {
          const rid = client.requests.get(msg.id);
          if (rid !== undefined) this.engine.abort(rid);
          break;
        }
        case "abortAll":
          // alone on the engine: every request ends with finish_reason "abort"; shared: only
          // this client's requests stop (as aborted ones), never another client's
          if (this.attachedClients().every((c) => c === client)) this.engine.abortAll();
          else for (const rid of client.requests.values()) this.engine.abort(rid);
          client.send({ kind: "ok", id: msg.id });
          break;
        case "stats":
          client.send({ kind: "ok", id: msg.id, data: this.engine.stats() });
          break;
        case "unload":
          await this.leave(client, false);
          client.send({ kind: "ok", id: msg.id });
          break;
        case "detach":
          await this.leave(client);
          break;
      }
    } catch (e) {
      const error = isPayload(e) ? e : this.engine.toPayload(e);
      client.send({ kind: "error", id: msg.id, error });
    }
  }

  private attachedClients(): Client[] {
    return [...this.clients].filter((c) => c.attached && !c.gone);
  }

  /** Loads and unloads run one at a time, in order: a switch of models (unload, then load)
   * never overlaps another client's load. */
  private serial<T>(op: () => Promise<T>): Promise<T> {
    const run = this.queue.then(op);
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async attach(client: Client, msg: LoadMessage): Promise<EngineInfo> {
    const base = msg.baseUrl.replace(/\/$/, "");
    const progress = (p: Progress) => client.send({ kind: "progress", id: msg.id, progress: p });
    const watching = this.loading; // another client's load: show its progress while waiting
    watching?.watchers.add(progress);
    try {
      return await this.serial(async () => {
        if (this.current) {
          const { info } = this.current;
          if (this.current.base === base && answersTo(msg.model, { ...info, id: info.artifactId }) &&
              (!msg.quantization || msg.quantization === info.quantization) &&
              (!msg.backend || msg.backend === "auto" || msg.backend === info.backend) &&
              // (a client asking for the plain kernels, the same bits everywhere, gets them)
              (msg.relaxedSimd !== false || !info.device.includes("relaxed SIMD")) &&
              JSON.stringify(msg.speculative ?? null) === this.current.speculative) {
            client.attached = true;
            return { ...info, ...newStats(), attached: true }; // (this client loaded nothing)
          }
          if (this.attachedClients().some((c) => c !== client)) {
            throw payload("ModelInUseError", `The shared engine runs ${info.model} ${info.quantization} for ` +
              "other clients; it switches models when no other client is attached.",
              "invalid_request_error", "model_in_use", 409, "model");
          }
          this.current = null;
          await this.engine.unload();
        }
        const watchers = new Set<(p: Progress) => void>([progress]);
        this.loading = { watchers };
        try {
          const info = await this.engine.load(msg, (p) => watchers.forEach((w) => w(p)), this.post);
          this.current = { base, info, speculative: JSON.stringify(msg.speculative ?? null) };
          client.attached = true;
          return { ...info, attached: false };
        } finally {
          this.loading = null;
        }
      });
    } finally {
      watching?.watchers.delete(progress);
    }
  }

  /** The client stopped using the engine (unload) or is gone (detach, its lock released):
   * its running requests are aborted; the last one out frees the model unless keepLoaded. */
  private async leave(client: Client, gone = true): Promise<void> {
    for (const rid of client.requests.values()) this.engine.abort(rid);
    client.attached = false;
    if (gone) {
      client.gone = true;
      this.clients.delete(client);
    }
    if (this.keepLoaded) return;
    await this.serial(async () => {
      if (this.attachedClients().length || !this.current) return;
      this.current = null;
      await this.engine.unload();
    });
  }
}

function isPayload(e: unknown): e is ErrorPayload {
  return typeof e === "object" && e !== null && "error" in e && "class" in e && !(e instanceof Error);
}
