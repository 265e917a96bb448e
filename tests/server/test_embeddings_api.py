"""POST /v1/embeddings through the official ``openai`` client: a chat model (tiny Llama) and
an embedding model (a tiny random BERT, mean pooling, normalized) served side by side; the
vectors equal transformers' + the pooling; errors are OpenAI-shaped 400s; chat streams that
run while embeddings are computed give the text they give alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from openai import BadRequestError, OpenAI

from tests.server.conftest import HELLO, LiveServer, assert_openai_error, engine_loader, post

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = ["the lighthouse stood on the rocks", "a ship passed in the night", "rocks"]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    from tests.e2e.test_embeddings import _tiny_bert

    return _tiny_bert(tmp_path_factory.mktemp("bert") / "tiny-bert", "mean", True)


@pytest.fixture(scope="module")
def server(tiny_a, bert_dir, compiled):
    from wick.compiler.paths import artifacts_dir
    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost

    bert = compiled(bert_dir, "q0f32", prefill_chunk_size=64, max_batch_size=4)
    pool = ModelPool([engine_loader(tiny_a), engine_loader(bert)])
    live = LiveServer(create_app(pool, artifacts=ArtifactHost(artifacts_dir())))
    live.wait_ready()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def models(server):
    chat, embed = list(server.pool.engines)
    return chat, embed


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def _reference(bert_dir) -> np.ndarray:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bert_dir / "tokenizer.json"))
    tok.no_padding()
    model = transformers.BertModel.from_pretrained(bert_dir).eval()
    out = []
    for text in TEXTS:
        with torch.no_grad():
            h = model(torch.tensor([tok.encode(text).ids])).last_hidden_state[0].mean(0)
        out.append((h / h.norm()).numpy())
    return np.array(out)


def test_official_client_embeddings(client, models, bert_dir):
    _, embed = models
    ref = _reference(bert_dir)
    res = client.embeddings.create(model=embed, input=TEXTS)  # (the client asks for base64)
    got = np.array([d.embedding for d in res.data])
    assert [d.index for d in res.data] == [0, 1, 2] and res.model == embed
    assert ((got * ref).sum(1) > 0.99999).all()
    plain = client.embeddings.create(model=embed, input=TEXTS[0], encoding_format="float")
    assert np.allclose(plain.data[0].embedding, got[0], atol=1e-7)
    # the tokenizer's counts, [CLS] and [SEP] included
    assert res.usage.prompt_tokens == res.usage.total_tokens == 8 + 8 + 3


def test_errors_are_openai_shaped(server, client, models):
    chat, embed = models
    with pytest.raises(BadRequestError) as err:
        client.embeddings.create(model=chat, input="hello")
    assert err.value.body["param"] == "model" and err.value.body["code"] == "model_not_embedding"
    with pytest.raises(BadRequestError) as err:
        client.chat.completions.create(model=embed, messages=HELLO)
    assert err.value.body["code"] == "model_not_generative"
    assert_openai_error(post(server, "/v1/embeddings", {"model": embed, "input": ""}), 400,
                        param="input")
    assert_openai_error(post(server, "/v1/embeddings", {"model": embed, "input": "a",
                                                        "dimensions": 3}), 400, param="dimensions")
    assert_openai_error(post(server, "/v1/embeddings", {"model": embed}), 400, param="input")
    assert_openai_error(post(server, "/v1/embeddings", [1, 2]), 400)
    assert_openai_error(post(server, "/v1/embeddings", "{"), 400)
    assert_openai_error(post(server, "/v1/embeddings", {"model": "nope", "input": "a"}), 404)


def test_openapi_documents_the_route(server):
    import httpx

    doc = httpx.get(f"{server.url}/openapi.json").json()
    body = doc["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/EmbeddingRequest"}


def test_embeddings_beside_chat_streams(client, models):
    chat, embed = models
    ask = {"model": chat, "messages": HELLO, "max_tokens": 24, "temperature": 0}
    alone = client.chat.completions.create(**ask).choices[0].message.content
    with ThreadPoolExecutor(6) as pool:
        streams = [pool.submit(lambda: "".join(
            c.choices[0].delta.content or "" for c in client.chat.completions.create(
                **ask, stream=True) if c.choices)) for _ in range(3)]
        vectors = [pool.submit(client.embeddings.create, model=embed, input=TEXTS)
                   for _ in range(3)]
        texts = [f.result() for f in streams]
        first = [np.array([d.embedding for d in f.result().data]) for f in vectors]
    assert texts == [alone] * 3
    assert all(np.array_equal(v, first[0]) for v in first)


def test_browser_index_says_which_models_embed(server, models):
    import httpx

    _, embed = models
    index = httpx.get(f"{server.url}/web/models.json").json()["data"]
    tasks = {m["model"]: m["task"] for m in index}
    assert tasks[embed] == "embed" and "generate" in tasks.values()
