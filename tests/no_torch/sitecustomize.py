"""Put on PYTHONPATH of the wick processes the tests start (tests/conftest.py,
``wick_process_env``): torch, a test-only dependency, cannot be imported there, as in a user's
install. Where torch is installed, TVM's FFI imports it at start: ~3.5 s of every `wick`
command (4.5 s -> 1 s for `wick list` on CI's 2 cores)."""

import sys

sys.modules["torch"] = None  # `import torch` raises ImportError, which TVM's FFI handles
