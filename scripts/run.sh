#!/usr/bin/env bash
# The main job: set up, then serve the bundled SmolLM2-135M-Instruct: chat page at
# http://127.0.0.1:8000/ and the OpenAI API under /v1. `wick serve` compiles the variant this
# machine runs (q4f16_1 on a GPU with shader-f16, q4f32_1 on the CPU kernels) on first use,
# with progress on stderr, and reuses it from the cache afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/wick serve smollm2-135m-instruct "$@"
