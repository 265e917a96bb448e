"""A Ray Serve LLM application with wick as its engine, as docs/scale-out.md shows it (with Ray's
development ingress, which adds control routes such as /reset_prefix_cache), on a local Ray
cluster of its own: ``python ray_llm_app.py PORT ID=MODEL...`` (one ``LLMConfig`` per model).
It prints ``ready`` once the application runs and stops Ray on SIGTERM.
tests/server/test_ray_llm.py runs it with Ray Serve LLM's OpenAI types on its PYTHONPATH."""

import signal
import sys
import threading

import ray
from ray import serve
from ray.llm._internal.serve.core.ingress.dev_ingress import build_dev_openai_app
from ray.serve.llm import LLMConfig

from wick.ray import WickServer

port, models = int(sys.argv[1]), [arg.split("=", 1) for arg in sys.argv[2:]]
ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
serve.start(http_options={"host": "127.0.0.1", "port": port})
configs = [LLMConfig(model_loading_config={"model_id": name, "model_source": source},
                     server_cls=WickServer) for name, source in models]
# (build_openai_app's ingress plus control routes such as /reset_prefix_cache)
serve.run(build_dev_openai_app({"llm_configs": configs}))
stop = threading.Event()
# (after ray.init, whose fatal-signal handler would abort the process on SIGTERM)
signal.signal(signal.SIGTERM, lambda *_: stop.set())
print("ready", flush=True)
stop.wait()
serve.shutdown()
ray.shutdown()
