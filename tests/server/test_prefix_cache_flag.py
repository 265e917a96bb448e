"""`wick serve` caches prompt prefixes by default and `--no-prefix-cache` turns it off: the same
prompt twice, through the app the command runs (``serving_app``), with ``cached_tokens`` in
the answers and the cached pages in /health."""

from __future__ import annotations

import argparse
import json
import time

import pytest
from starlette.testclient import TestClient

from wick.engine.artifact import MANIFEST_NAME
from wick.server.serve import add_serve_arguments, serving_app

PROMPT = "The same prompt twice: the second time its full pages come from the cache."


def twice(app) -> tuple[list[dict], dict]:
    """The usage of the same completion sent twice, and /health after them."""
    with TestClient(app, base_url="http://localhost") as c:
        deadline = time.monotonic() + 120
        while c.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (model,) = [m["id"] for m in c.get("/v1/models").json()["data"]]
        usages = []
        for _ in range(2):
            r = c.post("/v1/completions", json={"model": model, "prompt": PROMPT,
                                                "max_tokens": 1, "temperature": 0})
            assert r.status_code == 200, r.text
            usages.append(r.json()["usage"])
        return usages, c.get("/health").json()["engines"][model]


@pytest.mark.parametrize("flags", [[], ["--no-prefix-cache"]])
def test_serve_caches_prefixes_unless_told_not_to(tiny_a, flags):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args([str(tiny_a), *flags])
    assert args.prefix_cache is (not flags)
    app = serving_app(args.models, prefix_cache=args.prefix_cache, browser_variants=False)
    usages, health = twice(app)
    page_size = json.loads((tiny_a / MANIFEST_NAME).read_text())["model"]["page_size"]
    prompt_tokens = usages[0]["prompt_tokens"]
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    if flags:
        assert cached == [0, 0] and health["kv_pages_cached"] == 0
    else:
        assert cached == [0, (prompt_tokens - 1) // page_size * page_size] and cached[1] > 0
        assert health["kv_pages_cached"] > 0
    assert health["kv_pages_free"] + health["kv_pages_cached"] == health["kv_pages"]
