#!/usr/bin/env bash
# Set up wick on a fresh Debian/Ubuntu machine: system packages, a virtualenv in .venv, wick.
#   bash scripts/setup.sh          # what a user needs
#   bash scripts/setup.sh --test   # plus the test-time references (torch, transformers) and
#                                  # Debian Chromium + playwright for the browser tests
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

# A Vulkan driver for wgpu. lavapipe (CPU Vulkan, from mesa) is the fallback when there is no
# GPU driver; it is what CI and the tests run on.
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""; [ "$(id -u)" != 0 ] && sudo="sudo"
    echo "setup: installing mesa-vulkan-drivers (lavapipe)" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq mesa-vulkan-drivers >/dev/null
  else
    echo "setup: no apt-get; install a Vulkan driver (e.g. mesa-vulkan-drivers) yourself" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
echo "setup: installing wick${extras} into .venv" >&2
.venv/bin/python -m pip install -q -e ".${extras}"

# The browser engine (web/ + wasm/): JS bundles and Pyodide assets under pyserver/static/, built
# when npm is available (the server and the Python engine work without them).
if command -v npm >/dev/null 2>&1; then
  echo "setup: building the browser engine (web/build.sh)" >&2
  bash web/build.sh "$PWD/.venv/bin/python" || echo "setup: the browser engine build failed (bash web/build.sh); the server works without it" >&2
else
  echo "setup: npm not found; skipping the browser engine build (bash web/build.sh)" >&2
fi

# Browser tests drive Debian's Chromium (headless, --enable-unsafe-webgpu) with playwright;
# `playwright install` is never used.
if [ -n "$extras" ] && [ ! -x /usr/bin/chromium ]; then
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""; [ "$(id -u)" != 0 ] && sudo="sudo"
    echo "setup: installing chromium (browser tests)" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
  else
    echo "setup: no apt-get; install Chromium at /usr/bin/chromium for the browser tests" >&2
  fi
fi
