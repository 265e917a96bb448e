// The chat page: /v1/models for the picker, /v1/chat/completions streamed as server-sent events.
const $ = (id) => document.getElementById(id);
const history = []; // {role, content}
let controller = null;

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value || localStorage.getItem("wick-api-key");
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

async function errorText(res) {
  try { return (await res.json()).error.message; } catch { return `HTTP ${res.status}`; }
}

async function loadModels() {
  const res = await fetch("/v1/models", { headers: headers() });
  if (res.status === 401) {
    $("key-label").hidden = false;
    $("status").textContent = "This server needs an API key.";
    return;
  }
  if (!res.ok) { $("status").textContent = await errorText(res); return; }
  const { data } = await res.json();
  $("model").replaceChildren(...data.map((m) => new Option(m.id, m.id)));
  $("status").textContent = data.length ? "" : "No model loaded yet (see /health); reload later.";
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
        yield JSON.parse(data);
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
  let reply = "", usage = null, firstToken = null;
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), signal: controller.signal,
      body: JSON.stringify({
        model: $("model").value || undefined, messages: history, stream: true,
        stream_options: { include_usage: true },
        temperature: Number($("temperature").value), max_tokens: Number($("max-tokens").value) || undefined,
      }),
    });
    if (!res.ok) throw new Error(await errorText(res));
    for await (const chunk of events(res.body)) {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const piece = chunk.choices?.[0]?.delta?.content;
      if (piece) { firstToken ??= performance.now(); reply += piece; out.textContent = reply; }
    }
    history.push({ role: "assistant", content: reply });
    const secs = (performance.now() - started) / 1000;
    if (usage) {
      const ttft = firstToken ? ((firstToken - started) / 1000).toFixed(2) : "-";
      $("status").textContent = `${usage.completion_tokens} tokens in ${secs.toFixed(1)} s ` +
        `(${(usage.completion_tokens / secs).toFixed(1)} tok/s, first token ${ttft} s)`;
    }
  } catch (err) {
    if (err.name === "AbortError") {
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
loadModels();
