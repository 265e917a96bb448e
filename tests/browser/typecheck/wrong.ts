// Must NOT compile (tests/browser/test_build_and_routes.py): a misspelt field of a tool, a
// role the protocol does not know, a response format without its schema's name.
import { createEngine } from "../../../web/src/client.js";

export async function app(): Promise<void> {
  const engine = await createEngine("m");
  await engine.chat.completions.create({ messages: [{ role: "user", content: "hi" }],
    tools: [{ type: "function", function: { nme: "f" } }] });
  await engine.chat.completions.create({ messages: [{ role: "robot", content: "hi" }] });
  await engine.chat.completions.create({ messages: [], response_format: { type: "json_schema", json_schema: {} } });
}
