#!/usr/bin/env bash
# The main job: set up, compile the bundled SmolLM2-135M-Instruct (cached after the first time)
# and serve it: chat page at http://127.0.0.1:8000/ and the OpenAI API under /v1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/wick compile smollm2-135m-instruct
exec .venv/bin/wick serve smollm2-135m-instruct "$@"
