// A web app using wick from npm (`npm install wick-web`), bundled with esbuild or Vite. The
// models, the runtime and the engine's worker come from a `wick export` site (or a wick host)
// at `site`; across origins that host must send CORS headers (Access-Control-Allow-Origin).
import { createEngine } from "wick-web";

const params = new URLSearchParams(location.search);
const site = params.get("site") ?? "https://example.com/wick-site/";
const out = document.getElementById("out");

const engine = await createEngine(params.get("model") ?? "smollm2-135m-instruct", {
  baseUrl: site,
  onProgress: (p) => { out.textContent = `${p.stage}: ${p.text}`; },
});
out.textContent = "";
const stream = await engine.chat.completions.create({
  messages: [{ role: "user", content: params.get("q") ?? "Name a color." }],
  max_tokens: Number(params.get("n") ?? 64), temperature: 0, stream: true,
});
for await (const chunk of stream) out.textContent += chunk.choices[0]?.delta?.content ?? "";
globalThis.wickAppDone = { text: out.textContent, info: engine.info };
