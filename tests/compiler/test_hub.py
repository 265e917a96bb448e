"""hf:// models fetched through huggingface_hub from a loopback stand-in of the Hub
(tests/hub_standin.py): what is downloaded, revisions, gated and private repos, the cache without
network, a dropped connection resumed, and the error each failure gives."""

from __future__ import annotations

import json

import pytest

from tests.hub_standin import StandinHub, using

CONFIG = json.dumps({"model_type": "llama"}).encode()


@pytest.fixture
def hub(tmp_path):
    hub = StandinHub()
    with using(hub, tmp_path / "hf-cache") as patch:
        hub.patch = patch
        yield hub
    hub.close()


def hf_repo(weights: bytes = b"w" * 4000) -> dict[str, bytes]:
    """An HF model repo as the Hub holds one: what wick reads, and what it must not fetch."""
    return {"config.json": CONFIG, "generation_config.json": b'{"temperature": 0.5}',
            "tokenizer.json": b'{"model": {}}', "tokenizer_config.json": b'{"eos_token": "</s>"}',
            "model.safetensors": weights, "vocab.json": b"{}", "merges.txt": b"",
            "README.md": b"# card", ".gitattributes": b"*.bin lfs",
            "pytorch_model.bin": b"p" * 5000, "onnx/model.onnx": b"o" * 5000,
            "model-q4_k_m.gguf": b"g" * 3000}


@pytest.mark.parametrize("uri,repo,revision,filename", [
    ("hf://org/model", "org/model", None, None),
    ("HF://org/model", "org/model", None, None),  # as MLC-LLM writes it
    ("hf://org/model@v1.0", "org/model", "v1.0", None),
    ("hf://org/model@refs/pr/3", "org/model", "refs/pr/3", None),
    ("hf://org/model/sub/model-Q4_K_M.gguf", "org/model", None, "sub/model-Q4_K_M.gguf"),
    ("hf://org/model@main/model.gguf", "org/model", "main", "model.gguf"),
])
def test_uris_parse(uri, repo, revision, filename):
    from wick.compiler.hub import is_hub_uri, parse

    ref = parse(uri)
    assert is_hub_uri(uri)
    assert (ref.repo_id, ref.revision, ref.filename) == (repo, revision, filename)


@pytest.mark.parametrize("uri,says", [
    ("hf://model", "hf://ORG/REPO"),
    ("hf://datasets/org/data", "a dataset repo"),
    ("hf://org/model/README.md", "must name a .gguf file"),
])
def test_bad_uris_say_what_to_write(uri, says):
    from wick.compiler.hub import parse
    from wick.engine.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as caught:
        parse(uri)
    assert says in caught.value.message and caught.value.param == "model"


def test_a_model_repo_fetches_only_what_wick_reads(hub):
    from wick.compiler.hub import fetch

    commit = hub.add("org/model", hf_repo())
    fetched = fetch("hf://org/model")
    assert fetched.kind == "hf" and fetched.repo_id == "org/model"
    assert fetched.origin == f"hf://org/model@{commit}"
    assert sorted(p.name for p in fetched.path.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json"]
    assert (fetched.path / "model.safetensors").read_bytes() == b"w" * 4000
    fetched_files = {r.path.rsplit("/", 1)[-1] for r in hub.asked("GET", "/resolve/")}
    assert fetched_files == {"config.json", "generation_config.json", "model.safetensors",
                             "tokenizer.json", "tokenizer_config.json"}


def test_a_repo_without_tokenizer_json_gets_its_vocab_and_merges(hub):
    """(OPT's repos: a GPT-2-style tokenizer's files; the repo above, with a tokenizer.json,
    does not get them)"""
    from wick.compiler.hub import fetch

    repo = {k: v for k, v in hf_repo().items() if k != "tokenizer.json"}
    hub.add("org/old", {**repo, "special_tokens_map.json": b'{"eos_token": "</s>"}'})
    fetched = fetch("hf://org/old")
    assert {"vocab.json", "merges.txt", "special_tokens_map.json"} <= {
        p.name for p in fetched.path.iterdir()}
    assert not (fetched.path / "pytorch_model.bin").exists()


def test_a_repo_without_safetensors_gets_its_torch_weights(hub):
    """(older repos: pytorch_model.bin, or its shards and their index; the repos above, with
    safetensors, do not get them, nor does any repo get a trainer's other .bin files)"""
    from wick.compiler.hub import fetch

    repo = {k: v for k, v in hf_repo().items() if k not in ("model.safetensors",
                                                             "pytorch_model.bin")}
    shards = {"pytorch_model-00001-of-00002.bin": b"1" * 3000,
              "pytorch_model-00002-of-00002.bin": b"2" * 3000,
              "pytorch_model.bin.index.json": b'{"weight_map": {}}'}
    hub.add("org/bin", {**repo, **shards, "training_args.bin": b"t", "tf_model.h5": b"h" * 900})
    fetched = fetch("hf://org/bin")
    assert fetched.kind == "hf"
    names = {p.name for p in fetched.path.iterdir()}
    assert set(shards) <= names and not {"training_args.bin", "tf_model.h5"} & names
    assert (fetched.path / "pytorch_model-00002-of-00002.bin").read_bytes() == b"2" * 3000


def test_mistrals_consolidated_copy_is_not_fetched_beside_the_shards(hub):
    """(Mistral's repos hold the same weights twice: transformers' shards and one
    consolidated.safetensors in Mistral's own format, 48 GB for Mistral Small)"""
    from wick.compiler.hub import fetch

    repo = {k: v for k, v in hf_repo().items() if k != "model.safetensors"}
    shards = {"model-00001-of-00002.safetensors": b"1" * 900,
              "model-00002-of-00002.safetensors": b"2" * 900,
              "model.safetensors.index.json": b'{"weight_map": {}}'}
    hub.add("org/mistral", {**repo, **shards, "consolidated.safetensors": b"c" * 1800,
                            "chat_template.json": b'{"chat_template": "x"}'})
    names = {p.name for p in fetch("hf://org/mistral").path.iterdir()}
    assert set(shards) | {"chat_template.json"} <= names
    assert "consolidated.safetensors" not in names


def test_a_gguf_repo_and_a_named_gguf(hub):
    from wick.compiler.hub import fetch
    from wick.engine.errors import InvalidRequestError

    commit = hub.add("org/one", {"README.md": b"x", "tiny-Q8_0.gguf": b"g" * 2000})
    one = fetch("hf://org/one")
    assert one.kind == "gguf" and one.path.name == "tiny-Q8_0.gguf"
    assert one.path.read_bytes() == b"g" * 2000
    assert one.origin == f"hf://org/one@{commit}/tiny-Q8_0.gguf"
    hub.add("org/many", {"a-Q4_K_M.gguf": b"a", "sub/b-Q8_0.gguf": b"b"})
    with pytest.raises(InvalidRequestError, match=r"holds 2 GGUF files .*name one, as "
                                                  r"hf://org/many/a-Q4_K_M.gguf"):
        fetch("hf://org/many")
    named = fetch("hf://org/many/sub/b-Q8_0.gguf")
    assert named.path.read_bytes() == b"b" and named.origin.endswith("/sub/b-Q8_0.gguf")
    # a repo of safetensors that also holds GGUF exports is read as the HF model
    hub.add("org/both", hf_repo())
    assert fetch("hf://org/both").kind == "hf"
    hub.add("org/none", {"README.md": b"x", "model.onnx": b"o"})
    with pytest.raises(InvalidRequestError, match="holds no model wick reads"):
        fetch("hf://org/none")


def test_revisions_by_branch_and_commit(hub):
    from wick.compiler.hub import fetch

    main = hub.add("org/model", hf_repo(b"main" * 100))
    v2 = hub.add("org/model", hf_repo(b"v2.." * 100), revision="v2")
    assert main != v2
    for uri, commit, weights in [("hf://org/model", main, b"main"), ("hf://org/model@v2", v2, b"v2.."),
                                 (f"hf://org/model@{main}", main, b"main")]:
        fetched = fetch(uri)
        assert fetched.origin == f"hf://org/model@{commit}"
        assert (fetched.path / "model.safetensors").read_bytes() == weights * 100
    asked = len(hub.requests)
    assert fetch(f"hf://org/model@{v2}").origin == f"hf://org/model@{v2}"
    assert len(hub.requests) == asked  # a commit in the cache: the Hub is not asked again


def test_gated_and_private_repos_need_a_token(hub):
    from wick.compiler.hub import HubAccessError, HubNotFoundError, fetch

    hub.add("org/gated", {"m.gguf": b"g"})
    hub.gate("org/gated", tokens={"hf_granted"})
    hub.add("org/private", {"m.gguf": b"p"})
    hub.gate("org/private", tokens={"hf_granted"}, private=True)
    with pytest.raises(HubAccessError) as gated:
        fetch("hf://org/gated")
    assert gated.value.status == 403 and gated.value.code == "model_gated"
    assert "accept the model's terms" in gated.value.message and "HF_TOKEN" in gated.value.message
    with pytest.raises(HubNotFoundError, match="if it is private, set HF_TOKEN"):
        fetch("hf://org/private")
    hub.patch.setenv("HF_TOKEN", "hf_other")
    with pytest.raises(HubAccessError, match="has no access"):
        fetch("hf://org/gated")
    hub.patch.setenv("HF_TOKEN", "hf_granted")
    assert fetch("hf://org/gated").path.read_bytes() == b"g"
    assert fetch("hf://org/private").path.read_bytes() == b"p"
    granted = [r for r in hub.asked("GET", "/org/gated/resolve/")]
    assert granted and all(r.headers.get("authorization") == "Bearer hf_granted"
                           for r in granted)


def test_missing_repo_revision_and_file(hub):
    from wick.compiler.hub import HubNotFoundError, fetch

    hub.add("org/model", hf_repo())
    for uri, code, says in [
        ("hf://org/absent", "model_not_found", "no such model repo"),
        ("hf://org/model@nope", "revision_not_found", "no revision 'nope'"),
        ("hf://org/model/absent.gguf", "file_not_found", "no file 'absent.gguf'"),
    ]:
        with pytest.raises(HubNotFoundError) as caught:
            fetch(uri)
        assert caught.value.status == 404 and caught.value.code == code
        assert says in caught.value.message and caught.value.param == "model"


def test_the_cache_serves_without_network(hub, tmp_path, caplog):
    """Fetched once, a repo is found again with the Hub unreachable (a dead port) and with
    HF_HUB_OFFLINE; one never fetched says so and what to do, at once (a named GGUF went
    through hf_hub_download's request, retried five times over 23 s, a log line each)."""
    from huggingface_hub import constants

    from wick.compiler.hub import HubUnreachableError, fetch

    commit = hub.add("org/model", hf_repo())
    hub.add("org/gguf", {"m.gguf": b"g" * 100})
    hub.add("org/bin", {k: v for k, v in hf_repo().items() if k != "model.safetensors"})
    online = [fetch("hf://org/model"), fetch("hf://org/gguf"), fetch("hf://org/gguf/m.gguf"),
              fetch("hf://org/bin")]
    hub.close()
    dead = "http://127.0.0.1:9"  # (discard: nothing listens)
    with using(dead, tmp_path / "hf-cache"):
        assert [fetch("hf://org/model"), fetch("hf://org/gguf"),
                fetch("hf://org/gguf/m.gguf"), fetch("hf://org/bin")] == online
        assert (online[3].path / "pytorch_model.bin").is_file()
        assert fetch(f"hf://org/model@{commit}") == online[0]
        with pytest.raises(HubUnreachableError) as caught:
            fetch("hf://org/never")
        assert caught.value.status == 502 and "cannot reach http://127.0.0.1:9" in caught.value.message
        assert "not in the Hugging Face cache" in caught.value.message
        for never in ("hf://org/never/m.gguf", "hf://org/gguf/other.gguf"):
            with pytest.raises(HubUnreachableError, match="cannot reach http://127.0.0.1:9"):
                fetch(never)
        assert not [r for r in caplog.records if "Retrying" in r.getMessage()]
    with using(dead, tmp_path / "hf-cache") as patch:
        patch.setattr(constants, "HF_HUB_OFFLINE", True)
        assert fetch("hf://org/model") == online[0]
        with pytest.raises(HubUnreachableError, match="HF_HUB_OFFLINE is set"):
            fetch("hf://org/never")


def test_a_dropped_download_resumes_where_it_stopped(hub):
    from huggingface_hub import constants

    from wick.compiler.hub import fetch

    hub.patch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1 << 14)
    data = bytes(range(256)) * 400  # 100 KiB
    hub.add("org/big", {"big.gguf": data})
    hub.cut_once("org/big", "big.gguf", 50_000)
    assert fetch("hf://org/big/big.gguf").path.read_bytes() == data
    gets = hub.asked("GET", "/resolve/")
    assert len(gets) == 2 and "range" not in gets[0].headers
    resumed_at = int(gets[1].headers["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 50_000  # the bytes before the cut were kept, not fetched again


def test_a_hub_that_is_down_leaves_the_cache_usable(hub):
    from wick.compiler.hub import HubUnreachableError, fetch

    hub.add("org/model", hf_repo())
    hub.add("org/later", hf_repo(b"l" * 4000))
    fetched = fetch("hf://org/model")
    hub.down = True
    assert fetch("hf://org/model") == fetched
    with pytest.raises(HubUnreachableError) as caught:
        fetch("hf://org/later")
    assert caught.value.status == 502
    assert f"{hub.url} answered 503 for hf://org/later" in caught.value.message
