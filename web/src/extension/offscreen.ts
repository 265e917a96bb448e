/**
 * The extension's offscreen document: it keeps the engine's Worker (wick-worker.js, the same
 * one a web page starts) alive for as long as the extension wants it, and hands the worker one
 * MessagePort per chrome.runtime port (side panel, extension pages, allowed sites via the
 * service worker). The worker's hub serves them all from one loaded model.
 */

import { PORT_NAME } from "../worker_protocol.js";
import type { ToWorker } from "../worker_protocol.js";

let worker: Worker | null = null;
const clients = new Set<chrome.runtime.Port>();

function engineWorker(): Worker {
  if (worker) return worker;
  const w = new Worker(new URL("wick-worker.js", location.href), { type: "module" });
  w.onerror = () => { // the engine is gone: its clients learn it from their ports closing
    w.terminate();
    if (worker === w) worker = null;
    for (const port of clients) port.disconnect();
    clients.clear();
  };
  worker = w;
  return w;
}

chrome.runtime.onConnect.addListener((port) => {
  if (port.name !== PORT_NAME) return;
  const { port1, port2 } = new MessageChannel();
  engineWorker().postMessage({ kind: "connect" }, [port2]);
  port1.onmessage = (ev) => port.postMessage(ev.data);
  port.onMessage.addListener((m: ToWorker) => port1.postMessage(m));
  clients.add(port);
  port.onDisconnect.addListener(() => {
    clients.delete(port);
    port1.postMessage({ kind: "detach", id: 0 } satisfies ToWorker);
    port1.close();
  });
});
