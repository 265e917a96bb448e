"""Put on PYTHONPATH of the wick processes the tests start (tests/conftest.py,
``wick_process_env``): torch, a test-only dependency, cannot be imported there, as in a user's
install. Where torch is installed, TVM's FFI imports it at start: ~3.5 s of every `wick`
command (4.5 s -> 1 s for `wick list` on CI's 2 cores).

``WICK_TEST_WITHOUT=a,b``: these modules cannot be imported either (and
``importlib.util.find_spec`` finds none), as in an install without them: the runtime-only
install's test blocks the compile extra's (tvm, tvm_ffi, ziglang)."""

import os
import sys

for _name in ["torch", *filter(None, os.environ.get("WICK_TEST_WITHOUT", "").split(","))]:
    sys.modules[_name] = None  # `import` raises ImportError (which TVM's FFI handles for torch)
