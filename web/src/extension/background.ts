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

import { permissionDenied } from "../errors.js";
import { PORT_NAME } from "../worker_protocol.js";
import type { ToWorker } from "../worker_protocol.js";
import { settings } from "./settings.js";

const OFFSCREEN = "offscreen.html";
let creating: Promise<void> | null = null;

async function startEngine(): Promise<void> {
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

chrome.runtime.onInstalled.addListener(() => {
  void chrome.sidePanel.setPanelBehavior({ openPanelOnActionClick: true });
});

chrome.runtime.onMessage.addListener((msg, _sender, reply) => {
  if (msg?.wick !== "start-engine") return false;
  startEngine().then(() => reply({ ok: true }), (e) => reply({ error: String(e) }));
  return true; // (answers asynchronously)
});

chrome.runtime.onConnectExternal.addListener((page) => {
  const queued: ToWorker[] = [];
  let forward: ((m: ToWorker) => void) | null = null;
  page.onMessage.addListener((m: ToWorker) => (forward ? forward(m) : queued.push(m)));
  void (async () => {
    const config = await settings();
    const origin = page.sender?.origin;
    if (page.name !== PORT_NAME || !origin || !config.allowedOrigins.includes(origin)) {
      // the same answer whatever the reason: the page learns nothing else
      forward = (m) => {
        page.postMessage({ kind: "error", id: m.id, error: permissionDenied() });
        page.disconnect();
      };
    } else {
      await startEngine();
      const engine = chrome.runtime.connect({ name: PORT_NAME });
      engine.onMessage.addListener((m) => page.postMessage(m));
      engine.onDisconnect.addListener(() => page.disconnect());
      page.onDisconnect.addListener(() => engine.disconnect());
      forward = (m) => engine.postMessage(m.kind === "load"
        ? { ...m, baseUrl: config.host, apiKey: config.apiKey } : m);
    }
    for (const m of queued.splice(0)) forward(m);
  })();
});
