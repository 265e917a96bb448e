// Compiled by tests/browser/test_build_and_routes.py against web/src/client.ts (tsc --strict):
// what an app writes with the openai package's shapes must type-check against wick's types,
// which are generated from the engine's protocol.
import { createEngine } from "../../../web/src/client.js";
import type {
  ChatCompletionChunk, ChatCompletionMessageParam, ChatCompletionMessageToolCall, ChatCompletionTool,
  ResponseFormat,
} from "../../../web/src/client.js";

export async function app(): Promise<string> {
  const engine = await createEngine("qwen2.5-coder-0.5b-instruct", { baseUrl: "https://example.com/site/" });
  const tools: ChatCompletionTool[] = [{
    type: "function",
    function: { name: "get_weather", description: "the weather in a city",
                parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
  }];
  const messages: ChatCompletionMessageParam[] = [{ role: "user", content: "Weather in Paris?" }];
  const reply = await engine.chat.completions.create({ messages, tools, tool_choice: "auto", max_tokens: 64 });
  const calls: ChatCompletionMessageToolCall[] = reply.choices[0].message.tool_calls ?? [];
  for (const call of calls) {
    messages.push({ role: "assistant", content: null, tool_calls: [{ id: call.id, type: "function",
      function: { name: call.function.name, arguments: call.function.arguments } }] });
    messages.push({ role: "tool", tool_call_id: call.id, content: JSON.stringify({ celsius: 21 }) });
  }
  const format: ResponseFormat = { type: "json_schema", json_schema: { name: "answer", strict: true,
    schema: { type: "object", properties: { city: { type: "string" } } } } };
  const structured = await engine.chat.completions.create({ messages, response_format: format,
    logprobs: true, top_logprobs: 2, temperature: 0 });
  const first = structured.choices[0].logprobs?.content[0];
  const alternatives: number = first?.top_logprobs?.length ?? 0;
  let streamed = "";
  const stream = await engine.chat.completions.create({ messages, stream: true,
    stream_options: { include_usage: true } });
  for await (const chunk of stream) {
    const c: ChatCompletionChunk = chunk;
    streamed += c.choices[0]?.delta.content ?? "";
    for (const t of c.choices[0]?.delta.tool_calls ?? []) streamed += `${t.index}:${t.function.name}`;
    if (c.usage) streamed += ` (${c.usage.completion_tokens} tokens)`;
  }
  const legacy = await engine.completions.create({ prompt: "def add(a, b):", max_tokens: 16, logprobs: 2, echo: true });
  const offsets: number[] = legacy.choices[0].logprobs?.text_offset ?? [];
  return `${structured.choices[0].message.content}${alternatives}${streamed}${offsets.length}`;
}
