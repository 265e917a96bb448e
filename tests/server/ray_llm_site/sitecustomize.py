"""Imported at start-up by every Python process of tests/server/test_replicas.py's Ray Serve LLM
application (its driver, tests/server/ray_llm_app.py, has this folder on PYTHONPATH from
tests/server/conftest.py's ray_llm_env, and gives it to the application's Ray workers).

Ray Serve LLM takes its OpenAI request and response types from ``sglang.srt.entrypoints.openai
.protocol`` (pydantic models over ``openai`` and ``msgspec``), installed for the test without its
dependencies (.venv/ray-llm). Importing it runs ``sglang/__init__.py`` first, which imports torch
and patches transformers for SGLang's own runtime: ~6 s in each of the cluster's processes
(driver, ingress, one server per model), none of it used here. The ``sglang`` package is
registered here without running its ``__init__``, so its submodules load as they are. Then the
next ``sitecustomize`` on the path, if any, runs as it would have without this one."""

import importlib.machinery
import importlib.util
import os
import sys
import types

_spec = importlib.machinery.PathFinder.find_spec("sglang")
if _spec is not None and _spec.submodule_search_locations and "sglang" not in sys.modules:
    _package = types.ModuleType("sglang")
    _package.__spec__ = _spec
    _package.__path__ = list(_spec.submodule_search_locations)
    _package.__file__ = _spec.origin
    sys.modules["sglang"] = _package

_here = os.path.dirname(os.path.abspath(__file__))
_next = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != _here])
if _next is not None and _next.loader is not None:
    _module = importlib.util.module_from_spec(_next)
    _next.loader.exec_module(_module)
