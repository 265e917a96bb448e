// Bundle web/src into ES modules: wick.js (the client API) and wick-worker.js (the engine's
// worker), into pyserver/static/web/ (served at /static/web/). `node build.mjs [outdir]`.
import { build } from "esbuild";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const outdir = process.argv[2] ?? path.join(here, "..", "pyserver", "static", "web");
const common = { bundle: true, format: "esm", target: "es2022", sourcemap: true, logLevel: "warning",
  platform: "browser" };
await build({ ...common, entryPoints: { wick: path.join(here, "src", "client.ts") }, outdir });
await build({ ...common, entryPoints: { "wick-worker": path.join(here, "src", "worker.ts") }, outdir });
console.error(`web: wick.js, wick-worker.js -> ${outdir}`);
