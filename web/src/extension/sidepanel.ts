/** The side panel: wick's chat page (chat.js, the same file `wick serve` serves) on the
 * extension's engine: models from the extension's host, the engine from wick.js (which, in an
 * extension page, attaches to the extension's one engine, so the model stays loaded while the
 * panel is closed). */

import { settings } from "./settings.js";

const config = await settings();
(globalThis as unknown as { wickChat: unknown }).wickChat = {
  host: config.host.replace(/\/$/, ""),
  wickModule: chrome.runtime.getURL("wick.js"),
  apiKey: config.apiKey,
  extension: true,
};
await import(chrome.runtime.getURL("chat.js"));
