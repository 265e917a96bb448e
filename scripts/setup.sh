#!/usr/bin/env bash
# Set up wick on a fresh Debian/Ubuntu machine: system packages, a virtualenv in .venv, wick.
#   bash scripts/setup.sh          # what a user needs
#   bash scripts/setup.sh --test   # plus the test-time references (torch, transformers) and
#                                  # Debian Chromium + playwright for the browser tests
# One line per step; what the tools print goes to .venv/setup.log (shown if a step fails).
set -euo pipefail
cd "$(dirname "$0")/.."

extras="[compile]"  # (everything: the runtime-only install is plain `pip install wick-llm`)
[ "${1:-}" = "--test" ] && extras="[compile,test]"

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
LOG="$PWD/.venv/setup.log"
: > "$LOG"

# try "what" command...: run quietly, the output in $LOG; on failure show its tail, return 1
try() {
  local what="$1"; shift
  echo "setup: $what" >&2
  if ! "$@" >>"$LOG" 2>&1; then
    echo "setup: $what failed; the end of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    return 1
  fi
}
# step: the same, and a failure stops the setup
step() { try "$@" || exit 1; }

apt_install() {
  local sudo=""; [ "$(id -u)" != 0 ] && sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@"
}

# A Vulkan driver for wgpu. lavapipe (CPU Vulkan, from mesa) is the fallback when there is no
# GPU driver; it is what CI and the tests run on.
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    step "installing mesa-vulkan-drivers (lavapipe)" apt_install mesa-vulkan-drivers
  else
    echo "setup: no apt-get; install a Vulkan driver (e.g. mesa-vulkan-drivers) yourself" >&2
  fi
fi

step "upgrading pip" .venv/bin/python -m pip install -q --upgrade pip
# pip byte-compiles what it installs one file at a time (more than half of the install's
# time); compileall does it on every core, in the background beside the browser engine's build
# below. Compiled before anything runs: Ray Serve's actors, starting at once, each compiling
# fastapi from source missed the proxy's readiness checks on a busy machine (where
# PYTHONDONTWRITEBYTECODE is set, as on these machines, nothing compiled at import is kept).
# transformers' ~560 model folders are left out but for the families the tests load.
step "installing wick${extras} into .venv" .venv/bin/python -m pip install -q --no-compile -e ".${extras}"
# Structured output: xgrammar at the version the browser's web-xgrammar has. Its PyPI metadata
# asks for torch, triton and transformers, which wick never uses (it loads the C++ bindings
# only), so it goes in without its dependencies.
XGRAMMAR=$(.venv/bin/python -c "from wick.native.grammar import XGRAMMAR_VERSION as v; print(v)")
step "installing xgrammar ${XGRAMMAR}" .venv/bin/python -m pip install -q --no-compile --no-deps "xgrammar==${XGRAMMAR}"
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
HF_USED='auto|bert|gemma|gemma2|gemma3|gpt2|llama|mistral|phi3|qwen2|qwen3'
# (a few files of Python 2 in some packages do not compile: the exit status says nothing)
.venv/bin/python -m compileall -q -j 0 -x "/transformers/models/(?!($HF_USED)/)[^/]+/" "$SITE" \
  >"$PWD/.venv/setup-compile.log" 2>&1 &
byte_compile=$!
ray_llm=""
# (a stopped setup stops them, and their workers, too)
stop_background() {
  for pid in $byte_compile $ray_llm; do
    pkill -P "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
  done
}
trap stop_background EXIT
# The Ray Serve LLM tests (in tests/server/test_replicas.py) run Ray's LLM application with wick as
# its engine; Ray imports the OpenAI types of vLLM or SGLang. SGLang's, without SGLang's runtime,
# go into a directory of their own, on that application's PYTHONPATH only (the file says why each).
RAY_LLM_REQS=tests/server/ray_llm_requirements.txt
# (in the background, beside the browser engine's build: mostly unpacking, ~45 s; its own log)
if [ "${1:-}" = "--test" ] && ! cmp -s "$RAY_LLM_REQS" .venv/ray-llm/requirements.txt; then
  rm -rf .venv/ray-llm
  (
    LOG="$PWD/.venv/setup-ray-llm.log"; : > "$LOG"
    step "installing Ray Serve LLM's OpenAI types for its test (.venv/ray-llm)" \
      .venv/bin/python -m pip install -q --no-deps --target .venv/ray-llm -r "$RAY_LLM_REQS"
    cp "$RAY_LLM_REQS" .venv/ray-llm/requirements.txt
  ) &
  ray_llm=$!
fi

# The browser engine (web/ + wasm/): JS bundles and Pyodide assets under pyserver/static/, built
# with node and npm (Debian's, installed when missing); the server and the Python engine work
# without them.
if ! command -v npm >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  try "installing nodejs and npm (the browser engine's build)" apt_install nodejs npm || true
fi
if command -v npm >/dev/null 2>&1; then
  try "building the browser engine (web/build.sh)" bash web/build.sh "$PWD/.venv/bin/python" ||
    echo "setup: the server and the Python engine work without the browser engine" >&2
else
  echo "setup: npm not found; skipping the browser engine build (bash web/build.sh)" >&2
fi

if [ -n "$ray_llm" ]; then
  wait "$ray_llm" || exit 1
fi
wait "$byte_compile" || true
trap - EXIT

# Browser tests drive Debian's Chromium (headless, --enable-unsafe-webgpu) with playwright;
# `playwright install` is never used.
if [ "${1:-}" = "--test" ] && [ ! -x /usr/bin/chromium ]; then
  if command -v apt-get >/dev/null 2>&1; then
    step "installing chromium (browser tests)" apt_install chromium
  else
    echo "setup: no apt-get; install Chromium at /usr/bin/chromium for the browser tests" >&2
  fi
fi
echo "setup: done (log: .venv/setup.log)" >&2
