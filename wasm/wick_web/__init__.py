"""wick in Pyodide: the glue between the engine (``wick.engine``, unchanged) and the worker's
JavaScript: a Backend over the WebGPU executor, a Tokenizer over @mlc-ai/web-tokenizers, and the
host that answers the worker's requests. Shipped as its own wheel by ``wasm/build.py``."""
