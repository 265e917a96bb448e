#!/usr/bin/env bash
# Set up (with the test references) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
# every tool the suite drives is installed now: a test missing one fails instead of skipping
export WICK_REQUIRE_TOOLS=1
exec .venv/bin/python -m pytest tests -q -p no:cacheprovider --durations=15 "$@"
