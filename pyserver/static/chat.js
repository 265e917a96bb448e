// The chat page. Two engines: "browser": wick's engine in a Web Worker (/static/wick.js, models
// from /web/models.json), on this device's GPU through WebGPU, else on its CPU through the
// WebAssembly kernels; "server": the server's /v1/chat/completions streamed as server-sent
// events (models from /v1/models). The default is the browser engine on a hardware GPU, else
// the server when it has a model loaded (its native CPU kernels beat a browser's), else the
// browser engine.
// The Chrome extension's side panel runs this same file with `globalThis.wickChat` set: models
// from its host, the browser engine only, the extension's shared engine; so does a `wick
// export` site (static/site.js: `browserOnly`, no server to talk to).
const config = globalThis.wickChat ?? { host: "", wickModule: "/static/wick.js", extension: false };
const $ = (id) => document.getElementById(id);
const history = []; // {role, content}
let controller = null;
let wick = null; // the /static/wick.js module, once imported
let browserEngine = null; // {key, engine}
let f16 = false;
// per served model, what a chat sends for the sampling fields left unset (/v1/models'
// chat_sampling: the model's own defaults apply, or interactive ones where it has none)
const serverChatSampling = new Map();

const mode = () => $("engine").value;

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value || localStorage.getItem("wick-api-key") || config.apiKey;
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text;
  $("log").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

// The message of a failed response: the server's OpenAI-shaped error, else the status line.
async function errorText(res) {
  try { return (await res.json()).error.message; } catch { return `HTTP ${res.status} ${res.statusText}`; }
}

async function loadModels() {
  try {
    return await (mode() === "browser" ? loadBrowserModels() : loadServerModels());
  } catch (err) {
    $("status").textContent = `Could not list the models: ${err.message || err}`;
  }
}

let preparingTimer = null;

async function loadBrowserModels() {
  clearTimeout(preparingTimer);
  const res = await fetch(`${config.host}/web/models.json`, { headers: headers() });
  if (res.status === 401) { askForKey(); return; }
  $("key-label").hidden = !localStorage.getItem("wick-api-key");
  if (!res.ok) { $("status").textContent = await errorText(res); return; }
  const { data, preparing = [], loading = false } = await res.json();
  const runs = (m) => f16 || !m.features.includes("shader-f16");
  // variants this device can run, f16 ones first when it has shader-f16
  const usable = data.filter((m) => runs(m) && (m.task ?? "generate") === "generate")
    .sort((a, b) => Number(b.features.includes("shader-f16")) - Number(a.features.includes("shader-f16")));
  const known = new Set(usable.map((m) => m.model));
  // variants the server is still compiling for browsers like this one (no shader-f16)
  const coming = preparing.filter((p) => runs(p) && !known.has(p.model));
  const selected = $("model").value;
  $("model").replaceChildren(
    ...usable.map((m) => new Option(`${m.model} (${m.quantization})`, JSON.stringify([m.model, m.quantization]))),
    ...coming.map((p) => new Option(`${p.model} (${p.quantization}, ${p.error ? "unavailable" : "preparing"})`,
      JSON.stringify([p.model, p.quantization]))));
  if (selected && [...$("model").options].some((o) => o.value === selected)) $("model").value = selected;
  if (coming.length) {
    const p = coming[0];
    $("status").textContent = p.error
      ? `The server could not build ${p.model} ${p.quantization} for this browser: ${p.error}`
      : `The server is compiling ${p.model} ${p.quantization} for this browser (no shader-f16): ` +
        `${p.stage}${p.total > 1 ? ` ${p.done}/${p.total}` : ""}`;
    if (!p.error) preparingTimer = setTimeout(() => mode() === "browser" && loadModels(), 2000);
  } else if (!usable.length && loading) {
    $("status").textContent = "The server is still loading its models…";
    preparingTimer = setTimeout(() => mode() === "browser" && loadModels(), 2000);
  } else {
    $("status").textContent = usable.length ? "" : noChatModel(data);
  }
}

/** Why the model list is empty, and what to do. */
function noChatModel(data) {
  const embedders = [...new Set(data.filter((m) => m.task === "embed").map((m) => m.model))];
  const only = embedders.length ? ` (${embedders.join(", ")} ${embedders.length > 1 ? "are embedding models" :
    "is an embedding model"}: use it from wick.js, engine.embeddings.create)` : "";
  if (config.extension || config.browserOnly) return `This site offers no chat model${only}.`;
  return `The server offers no chat model this browser can run${only}; switch to the server engine.`;
}

function askForKey() {
  $("key-label").hidden = false;
  $("status").textContent = "This server needs an API key: enter it above.";
  $("model").replaceChildren();
}

async function browserEngineFor(key) {
  if (!key) throw new Error("No model is selected: the server offers none this browser can run yet.");
  if (browserEngine?.key === key) return browserEngine.engine;
  if (browserEngine) { const old = browserEngine.engine; browserEngine = null; await old.unload(); }
  const [model, quantization] = JSON.parse(key);
  wick ??= await import(config.wickModule);
  const bar = $("progress");
  bar.hidden = false;
  try {
    const engine = await wick.createEngine(model, {
      quantization,
      apiKey: $("api-key").value || localStorage.getItem("wick-api-key") || config.apiKey || undefined,
      onProgress: (p) => {
        if (p.total) { bar.max = p.total; bar.value = p.loaded; }
        $("status").textContent = `${p.stage}: ${p.text}` +
          (p.stage === "download" ? ` (${(p.loaded / 1048576).toFixed(1)} / ${(p.total / 1048576).toFixed(1)} MiB)` : "");
      },
    });
    browserEngine = { key, engine };
    const info = engine.info;
    $("status").textContent = `${info.model} ${info.quantization} on ${info.device}${threadsText(info)}` +
      (info.attached ? " (already loaded)" : "");
    return engine;
  } finally {
    bar.hidden = true;
  }
}

// The WebAssembly kernels run on every core only where the page is cross-origin isolated
// (COOP/COEP headers): say which.
function threadsText(info) {
  if (info.backend !== "wasm") return "";
  if (info.threads > 1) return `, ${info.threads} threads`;
  return globalThis.crossOriginIsolated ? ", 1 thread" : ", 1 thread: the page is not cross-origin isolated";
}

async function* browserChunks(body, signal) {
  const engine = await browserEngineFor($("model").value);
  yield* await engine.chat.completions.create({ ...engine.info.chatSampling, ...body, model: undefined },
    { signal });
}

async function* serverChunks(body, signal) {
  if (!$("model").value) throw new Error("No model is loaded on the server yet (see /health); try again shortly.");
  const res = await fetch("/v1/chat/completions", {
    method: "POST", headers: headers(), signal,
    body: JSON.stringify({ ...serverChatSampling.get($("model").value), ...body,
      model: $("model").value || undefined }),
  });
  if (!res.ok) throw new Error(await errorText(res));
  yield* events(res.body);
}

async function loadServerModels() {
  clearTimeout(preparingTimer);
  const res = await fetch("/v1/models", { headers: headers() });
  if (res.status === 401) { askForKey(); return; }
  if (!res.ok) { $("status").textContent = await errorText(res); return; }
  const { data: all } = await res.json();
  const data = all.filter((m) => (m.task ?? "generate") === "generate"); // (not embedding models)
  for (const m of data) serverChatSampling.set(m.id, m.chat_sampling ?? {});
  $("model").replaceChildren(...data.map((m) => new Option(m.id, m.id)));
  $("status").textContent = data.length ? "" : all.length ? "This server serves no chat model."
    : "The server is still loading its models…";
  // (asked again until one is there: a server starts answering before its models are loaded)
  if (!all.length) preparingTimer = setTimeout(() => mode() === "server" && loadModels(), 2000);
}

// Yields the parsed JSON of each `data:` event until `data: [DONE]`.
async function* events(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        let parsed;
        try { parsed = JSON.parse(data); } catch { throw new Error("The server sent a malformed event; the reply is incomplete."); }
        yield parsed;
      }
    }
  }
}

async function send(text) {
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const out = addMessage("assistant", "");
  controller = new AbortController();
  $("send").hidden = true; $("stop").hidden = false;
  const started = performance.now();
  let reply = "", usage = null, firstToken = null, thinking = null;
  try {
    // a message sent while the page still asks what the server offers waits for the answer
    // (else it would find no model chosen yet)
    await ready;
    const body = {
      messages: history, stream: true, stream_options: { include_usage: true },
      max_tokens: Number($("max-tokens").value) || undefined,
      // (empty: the model's default, see serverChatSampling)
      ...($("temperature").value === "" ? {} : { temperature: Number($("temperature").value) }),
    };
    const chunks = mode() === "browser" ? browserChunks(body, controller.signal) : serverChunks(body, controller.signal);
    for await (const chunk of chunks) {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices?.[0]?.delta;
      if (delta?.reasoning_content) {  // a reasoning model's thinking: shown apart, dimmed
        firstToken ??= performance.now();
        thinking ??= out.parentNode.insertBefore(Object.assign(document.createElement("div"),
          { className: "msg thinking" }), out);
        thinking.textContent += delta.reasoning_content;
      }
      const piece = delta?.content;
      if (piece) { firstToken ??= performance.now(); reply += piece; out.textContent = reply; }
    }
    history.push({ role: "assistant", content: reply });
    const ended = performance.now();
    const secs = (ended - started) / 1000;
    if (usage) {
      const ttft = firstToken ? ((firstToken - started) / 1000).toFixed(2) : "-";
      // the speed of generation: after the first token (the first also waits for a model
      // load, and the prompt); (two digits even when slow: "0.033")
      const n = usage.completion_tokens;
      const rate = firstToken && n > 1 && ended > firstToken ? (n - 1) / ((ended - firstToken) / 1000) : n / secs;
      const shown = rate >= 10 ? rate.toFixed(1) : rate.toPrecision(2);
      const cached = usage.prompt_tokens_details?.cached_tokens;
      const where = mode() === "browser" && browserEngine
        ? ` on ${browserEngine.engine.info.backend}${threadsText(browserEngine.engine.info)}` : "";
      $("status").textContent = `${usage.completion_tokens} tokens in ${secs.toFixed(1)} s ` +
        `(${shown} tok/s${where}, first token ${ttft} s${cached ? `, ${cached} prompt tokens cached` : ""})`;
    }
  } catch (err) {
    if (err.name === "AbortError" || err.name === "EngineAbortedError") {
      history.push({ role: "assistant", content: reply });
      $("status").textContent = "stopped";
    } else {
      history.pop();
      out.className = "msg error";
      out.textContent = String(err.message || err);
    }
  } finally {
    controller = null;
    $("send").hidden = false; $("stop").hidden = true;
  }
}

$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
});
$("stop").addEventListener("click", () => controller?.abort());
$("clear").addEventListener("click", () => { history.length = 0; $("log").replaceChildren(); });
$("api-key").addEventListener("change", () => {
  localStorage.setItem("wick-api-key", $("api-key").value);
  loadModels();
});
$("engine").addEventListener("change", () => {
  localStorage.setItem("wick-engine", mode());
  loadModels();
});

async function start() {
  let adapter = null;
  try { adapter = await navigator.gpu?.requestAdapter(); } catch { adapter = null; }
  f16 = Boolean(adapter?.features.has("shader-f16"));
  // a software adapter (SwiftShader) is a GPU emulated on the CPU: not the fast path
  const gpu = Boolean(adapter) && !(adapter.info?.isFallbackAdapter ?? adapter.isFallbackAdapter);
  const saved = localStorage.getItem("wick-engine");
  if (config.extension || config.browserOnly) { // the browser engine only: no server to talk to
    $("engine").closest("label").hidden = true;
  } else {
    $("engine").value = saved || (gpu || !(await serverHasModels()) ? "browser" : "server");
  }
  await loadModels();
}

/** Whether the server answers chats itself (a model served, or still loading). */
async function serverHasModels() {
  try {
    const res = await fetch(`${config.host}/web/models.json`, { headers: headers() });
    const index = res.ok ? await res.json() : {};
    return (index.served ?? []).length > 0 || Boolean(index.loading);
  } catch {
    return false;
  }
}
const ready = start();
