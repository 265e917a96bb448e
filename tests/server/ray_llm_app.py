"""A Ray Serve LLM application with wick as its engine, as docs/scale-out.md shows it (with Ray's
development ingress, which adds control routes such as /reset_prefix_cache), deployed on a
running Ray cluster whose Serve has an HTTP proxy (`ray start --head`, `serve start`):
``python ray_llm_app.py ADDRESS APP ID=MODEL...`` (one ``LLMConfig`` per model). It prints
``ready`` once the application runs; on SIGTERM it deletes its application and leaves the
cluster as it found it. tests/server/test_replicas.py runs it with Ray Serve LLM's OpenAI types on
its PYTHONPATH, which the application's Ray workers are given too (the job's runtime_env)."""

import os
import signal
import sys
import threading

import ray
from ray import serve
from ray.llm._internal.serve.core.ingress.dev_ingress import build_dev_openai_app
from ray.serve.llm import LLMConfig

from wick.ray import WickServer

address, app, models = sys.argv[1], sys.argv[2], [arg.split("=", 1) for arg in sys.argv[3:]]
# (the cluster's workers start with the raylet's environment: the job's runtime_env gives them
# this process's PYTHONPATH, and Serve gives the job's runtime_env to the app's deployments)
ray.init(address=address, log_to_driver=False,
         runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
configs = [LLMConfig(model_loading_config={"model_id": name, "model_source": source},
                     server_cls=WickServer) for name, source in models]
# (build_openai_app's ingress plus control routes such as /reset_prefix_cache)
serve.run(build_dev_openai_app({"llm_configs": configs}), name=app, route_prefix="/")
stop = threading.Event()
# (after ray.init, whose fatal-signal handler would abort the process on SIGTERM)
signal.signal(signal.SIGTERM, lambda *_: stop.set())
print("ready", flush=True)
stop.wait()
serve.delete(app)
ray.shutdown()
