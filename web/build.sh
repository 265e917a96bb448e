#!/usr/bin/env bash
# Build the browser engine: npm deps, the JS bundles (pyserver/static/web/) and the Pyodide
# assets + wheels (pyserver/static/wasm/). Needs node + npm; Python for wasm/build.py.
#   bash web/build.sh [python]
set -euo pipefail
cd "$(dirname "$0")"
PY="${1:-${PYTHON:-python3}}"
if [ -f package-lock.json ]; then npm ci --no-audit --no-fund --loglevel=error; else npm install --no-audit --no-fund --loglevel=error; fi
# the request/reply types from the engine's protocol (committed too: a Python that cannot import
# wick's server, e.g. a wheel's isolated build, keeps the committed file)
"$PY" protocol_types.py || echo "web: kept the committed src/protocol.gen.ts" >&2
npx --no-install tsc --noEmit -p .
node build.mjs
"$PY" ../wasm/build.py
