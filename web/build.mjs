// Bundle web/src into ES modules: wick.js (the client API) and wick-worker.js (the engine's
// worker), plus the API's type declarations, into pyserver/static/web/ (served at
// /static/web/); and the Chrome extension's scripts and pages (web/src/extension, its one
// folder) into pyserver/static/ext/ (`wick extension build` packs them). `node build.mjs [outdir]`.
// `node build.mjs --package`: the npm package's dist/ (wick.js, wick-worker.js, the types), no
// extension (npm pack runs it).
import { build } from "esbuild";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFileSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const PROTOCOL_SOURCES = ["worker_protocol.ts", "errors.ts"]; // (tests/browser/test_wasm.py reads these too)
const forPackage = process.argv[2] === "--package";
const outdir = forPackage ? path.join(here, "dist")
  : process.argv[2] ?? path.join(here, "..", "pyserver", "static", "web");
// both ends of the worker protocol carry the package version and a digest of the protocol's
// sources (its messages, src/worker_protocol.ts, and the error payloads they carry,
// src/errors.ts): builds that differ refuse each other with a typed error
const version = JSON.parse(readFileSync(path.join(here, "package.json"), "utf8")).version;
const protocolHash = createHash("sha256");
for (const file of PROTOCOL_SOURCES) protocolHash.update(readFileSync(path.join(here, "src", file)));
const protocol = protocolHash.digest("hex").slice(0, 16);
const common = { bundle: true, format: "esm", target: "es2022", sourcemap: true, logLevel: "warning",
  platform: "browser", define: { __WICK_VERSION__: JSON.stringify(version),
    __WICK_PROTOCOL__: JSON.stringify(protocol) } };
if (forPackage) rmSync(outdir, { recursive: true, force: true });
await build({ ...common, entryPoints: { wick: path.join(here, "src", "client.ts") }, outdir });
await build({ ...common, entryPoints: { "wick-worker": path.join(here, "src", "worker.ts") }, outdir });
const extdir = path.join(outdir, "..", "ext");
if (!forPackage) {
  rmSync(extdir, { recursive: true, force: true });
  await build({ ...common, sourcemap: false, outdir: extdir, entryPoints: Object.fromEntries(
    ["background", "offscreen", "sidepanel", "options"].map((n) => [n, path.join(here, "src", "extension", `${n}.ts`)])) });
  for (const page of readdirSync(path.join(here, "src", "extension")).filter((f) => f.endsWith(".html")))
    copyFileSync(path.join(here, "src", "extension", page), path.join(extdir, page));
}
// the public API's types beside the bundle: wick.d.ts -> types/client.d.ts
rmSync(path.join(outdir, "types"), { recursive: true, force: true });
execFileSync(path.join(here, "node_modules", ".bin", "tsc"), ["-p", here, "--noEmit", "false",
  "--declaration", "--emitDeclarationOnly", "--outDir", path.join(outdir, "types")], { stdio: "inherit" });
writeFileSync(path.join(outdir, "wick.d.ts"), 'export * from "./types/client.js";\n');
console.error(`web: wick.js, wick-worker.js, wick.d.ts -> ${outdir}` +
  (forPackage ? "" : `; extension scripts and pages -> ${extdir}`));
