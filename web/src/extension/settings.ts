/** The Chrome extension's settings: what `wick extension build` wrote (wick-extension.json),
 * overridden by what the user set on the options page (chrome.storage.local). */

export interface Settings {
  /** the wick host the models come from (`wick serve`'s URL) */
  host: string;
  /** web origins allowed to use the engine (createExtensionEngine); each must also match the
   * manifest's externally_connectable patterns, fixed at build time */
  allowedOrigins: string[];
  /** the host's API key (`wick serve --api-key`), if it has one */
  apiKey?: string;
}

export interface BuildConfig {
  host: string;
  allowedOrigins: string[];
  /** the manifest's externally_connectable patterns: the origins that can ask at all */
  connectable: string[];
}

export async function buildConfig(): Promise<BuildConfig> {
  return (await fetch(chrome.runtime.getURL("wick-extension.json"))).json();
}

export async function settings(): Promise<Settings> {
  const built = await buildConfig();
  const stored = await chrome.storage.local.get(["host", "allowedOrigins", "apiKey"]);
  return {
    host: (typeof stored.host === "string" && stored.host) || built.host,
    allowedOrigins: Array.isArray(stored.allowedOrigins) ? stored.allowedOrigins : built.allowedOrigins,
    apiKey: typeof stored.apiKey === "string" && stored.apiKey ? stored.apiKey : undefined,
  };
}
