#!/usr/bin/env bash
# Set up (with the test references) and run the whole test suite.
#   bash scripts/test.sh [PYTEST ARGS]   # everything (what CI runs)
#   bash scripts/test.sh --quick         # an inner loop of a few minutes: the engine, the
#                                        # compiler's units, the build, one browser smoke
#                                        # (sets up only when .venv is missing)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--quick" ]; then
  shift
  [ -x .venv/bin/python ] || bash scripts/setup.sh --test
  .venv/bin/python -m pytest -q -p no:cacheprovider -m "not slow" \
    tests/engine tests/test_import_cycles.py tests/compiler tests/browser/test_build_and_routes.py "$@"
  exec .venv/bin/python -m pytest -q -p no:cacheprovider \
    "tests/browser/test_chat_page.py::test_chat_page_browser_engine_screenshot"
fi
bash scripts/setup.sh --test
# every tool the suite drives is installed now: a test missing one fails instead of skipping
export WICK_REQUIRE_TOOLS=1
# two workers (pytest-xdist): compiles, references and browsers keep one core busy at a time
# for much of the run; a module stays on one worker (tests/conftest.py). WICK_TEST_WORKERS=0:
# one process.
exec .venv/bin/python -m pytest tests -q -p no:cacheprovider --durations=15 \
  -n "${WICK_TEST_WORKERS:-2}" --dist loadscope "$@"
