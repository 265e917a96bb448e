/** The options page: the model host, the models in the browser cache (size, delete one) and the
 * web origins allowed to use the engine. */

import { CACHE_NAME } from "../loader.js";
import { buildConfig, settings } from "./settings.js";

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;

function mib(n: number): string {
  return `${(n / 1048576).toFixed(1)} MiB`;
}

/** Cached artifact files grouped by artifact id (the `/artifacts/<id>/` part of their URL). */
async function cachedModels(): Promise<Map<string, { requests: Request[]; bytes: number }>> {
  const cache = await caches.open(CACHE_NAME);
  const models = new Map<string, { requests: Request[]; bytes: number }>();
  for (const req of await cache.keys()) {
    const m = /\/artifacts\/([^/]+)\//.exec(new URL(req.url).pathname);
    if (!m) continue;
    const id = decodeURIComponent(m[1]);
    const res = await cache.match(req);
    const bytes = Number(res?.headers.get("Content-Length")) || (res ? (await res.blob()).size : 0);
    const entry = models.get(id) ?? { requests: [], bytes: 0 };
    entry.requests.push(req);
    entry.bytes += bytes;
    models.set(id, entry);
  }
  return models;
}

async function showModels(): Promise<void> {
  const models = await cachedModels();
  const rows = [...models].sort(([a], [b]) => a.localeCompare(b)).map(([id, { requests, bytes }]) => {
    const li = document.createElement("li");
    li.dataset.artifact = id;
    li.append(`${id}: ${mib(bytes)} (${requests.length} files) `);
    const del = Object.assign(document.createElement("button"), { textContent: "delete", type: "button" });
    del.addEventListener("click", async () => {
      const cache = await caches.open(CACHE_NAME);
      await Promise.all(requests.map((r) => cache.delete(r)));
      await showModels();
    });
    li.append(del);
    return li;
  });
  $("models").replaceChildren(...rows);
  $("models-empty").hidden = rows.length > 0;
}

async function showOrigins(): Promise<void> {
  const { allowedOrigins } = await settings();
  $("origins").replaceChildren(...allowedOrigins.map((origin) => {
    const li = document.createElement("li");
    li.dataset.origin = origin;
    li.append(`${origin} `);
    const del = Object.assign(document.createElement("button"), { textContent: "remove", type: "button" });
    del.addEventListener("click", async () => {
      const now = (await settings()).allowedOrigins.filter((o) => o !== origin);
      await chrome.storage.local.set({ allowedOrigins: now });
      await showOrigins();
    });
    li.append(del);
    return li;
  }));
  $("origins-empty").hidden = allowedOrigins.length > 0;
}

function status(text: string): void {
  $("status").textContent = text;
}

$("host-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const input = $<HTMLInputElement>("host");
  let url: URL;
  try {
    url = new URL(input.value.trim());
  } catch {
    status("The host must be a URL, e.g. http://127.0.0.1:8000");
    return;
  }
  // the extension reads model files from the host: it needs the permission for its origin
  const granted = await chrome.permissions.request({ origins: [`${url.origin}/*`] }).catch(() => false);
  if (!granted) {
    status(`Chrome did not grant access to ${url.origin}; the host is unchanged.`);
    return;
  }
  await chrome.storage.local.set({ host: url.origin + url.pathname.replace(/\/$/, ""), apiKey: $<HTMLInputElement>("api-key").value });
  status(`Models now come from ${url.origin}.`);
});

$("origin-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const input = $<HTMLInputElement>("origin");
  let origin: string;
  try {
    origin = new URL(input.value.trim()).origin;
    if (!/^https?:\/\//.test(origin)) throw new Error("not a web origin");
  } catch {
    status("An origin looks like https://app.example");
    return;
  }
  const now = (await settings()).allowedOrigins;
  if (!now.includes(origin)) await chrome.storage.local.set({ allowedOrigins: [...now, origin] });
  input.value = "";
  await showOrigins();
});

async function start(): Promise<void> {
  const config = await settings();
  $<HTMLInputElement>("host").value = config.host;
  $<HTMLInputElement>("api-key").value = config.apiKey ?? "";
  $("connectable").textContent = (await buildConfig()).connectable.join(", ") || "none";
  await Promise.all([showModels(), showOrigins()]);
}
void start();
