#!/usr/bin/env bash
# The main job: set up, compile the bundled SmolLM2-135M-Instruct, and chat with it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/wick compile smollm2-135m-instruct
exec .venv/bin/wick chat smollm2-135m-instruct "$@"
