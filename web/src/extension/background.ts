/**
 * The extension's service worker. It hosts no engine: Chrome stops an idle service worker
 * after 30 s (and a module service worker cannot import() Pyodide), so the engine lives in an
 * offscreen document (offscreen.ts), which Chrome keeps until it is closed. This worker
 * - creates that document on demand (the `start-engine` message of extension pages);
 * - lets allowed web pages in: a chrome.runtime port from a page (externally_connectable) is
 *   checked against the allowed origins and relayed to the engine, its model files pinned to
 *   the extension's own host (a page never directs the extension's network access);
 * - opens the side panel from the toolbar button.
 */

import { payload, permissionDenied } from "../errors.js";
import type { ErrorPayload } from "../errors.js";
import { PORT_NAME } from "../worker_protocol.js";
import type { ToWorker } from "../worker_protocol.js";
import { settings } from "./settings.js";

const OFFSCREEN = "offscreen.html";
const KEEPALIVE_MS = 20_000;
let creating: Promise<void> | null = null;

async function startEngine(): Promise<void> {
  if (creating) return creating; // (a second caller while the document is being made)
  const url = chrome.runtime.getURL(OFFSCREEN);
  const open = await chrome.runtime.getContexts({
    contextTypes: [chrome.runtime.ContextType.OFFSCREEN_DOCUMENT], documentUrls: [url] });
  if (open.length) return;
  creating ??= chrome.offscreen.createDocument({
    url: OFFSCREEN, reasons: [chrome.offscreen.Reason.WORKERS],
    justification: "wick's engine: a Web Worker running the model on WebGPU for the side panel, " +
      "the extension's pages and the sites the user allowed",
  }).finally(() => { creating = null; });
  await creating;
}

// Chrome stops an idle service worker after 30 s, which would cut every relayed page off in
// the middle of a long request with no messages (a prefill, a non-streamed answer): while any
// page is relayed, an extension API call every 20 s keeps this worker up.
let relays = 0;
let keepalive: ReturnType<typeof setInterval> | undefined;
function relayOpened(): void {
  if (relays++ === 0) keepalive = setInterval(() => void chrome.runtime.getPlatformInfo(), KEEPALIVE_MS);
}
function relayClosed(): void {
  if (--relays === 0) clearInterval(keepalive);
}

chrome.runtime.onInstalled.addListener(() => {
  void chrome.sidePanel.setPanelBehavior({ openPanelOnActionClick: true });
});

chrome.runtime.onMessage.addListener((msg, _sender, reply) => {
  if (msg?.wick !== "start-engine") return false;
  startEngine().then(() => reply({ ok: true }), (e) => reply({ error: String(e) }));
  return true; // (answers asynchronously)
});

/** What a web page may ask of the engine: the model, and nothing about where files come
 * from, how much GPU memory to take or how to cache (the extension's settings decide). */
function fromPage(m: ToWorker, host: string, apiKey: string | undefined): ToWorker {
  if (m.kind !== "load") return m;
  return { kind: "load", id: m.id, model: m.model, quantization: m.quantization, baseUrl: host, apiKey,
    protocol: m.protocol, version: m.version }; // (the page's build: the engine checks it)
}

chrome.runtime.onConnectExternal.addListener((page) => {
  const queued: ToWorker[] = [];
  let forward: ((m: ToWorker) => void) | null = null;
  let gone = false;
  let engine: chrome.runtime.Port | null = null;
  page.onMessage.addListener((m: ToWorker) => (forward ? forward(m) : queued.push(m)));
  page.onDisconnect.addListener(() => {
    gone = true;
    engine?.disconnect();
  });
  const refuse = (error: ErrorPayload) => {
    forward = (m) => {
      page.postMessage({ kind: "error", id: m.id, error });
      page.disconnect();
    };
  };
  void (async () => {
    try {
      const config = await settings();
      const origin = page.sender?.origin;
      if (page.name !== PORT_NAME || !origin || origin === "null" || !config.allowedOrigins.includes(origin)) {
        refuse(permissionDenied()); // the same answer whatever the reason: the page learns nothing else
      } else {
        await startEngine();
        if (gone) return;
        const port = chrome.runtime.connect({ name: PORT_NAME });
        engine = port;
        relayOpened();
        port.onMessage.addListener((m) => page.postMessage(m));
        port.onDisconnect.addListener(() => {
          relayClosed();
          if (!gone) page.disconnect();
        });
        forward = (m) => port.postMessage(fromPage(m, config.host, config.apiKey));
      }
    } catch (e) {
      refuse(payload("LoadError", `the wick extension could not start its engine: ${String(e)}`,
        "load_error", "engine_start_failed", 500));
    }
    for (const m of queued.splice(0)) forward!(m);
  })();
});
