#!/usr/bin/env bash
# Build the browser engine: npm deps, the JS bundles (pyserver/static/web/) and the Pyodide
# assets + wheels (pyserver/static/wasm/). Needs node + npm; Python for wasm/build.py.
#   bash web/build.sh [python]
set -euo pipefail
cd "$(dirname "$0")"
PY="${1:-${PYTHON:-python3}}"
if [ -f package-lock.json ]; then npm ci --no-audit --no-fund --loglevel=error; else npm install --no-audit --no-fund --loglevel=error; fi
npx --no-install tsc --noEmit -p .
node build.mjs
# the public API's types beside the bundle: /static/web/wick.d.ts (-> types/client.d.ts)
rm -rf ../pyserver/static/web/types
npx --no-install tsc -p . --noEmit false --declaration --emitDeclarationOnly --outDir ../pyserver/static/web/types
echo 'export * from "./types/client.js";' > ../pyserver/static/web/wick.d.ts
"$PY" ../wasm/build.py
