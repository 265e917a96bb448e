"""Embedding models against transformers (+ the pooling their sentence-transformers files
name): a tiny random BERT (CLS and max pooling) and a tiny Qwen3 decoder with last-token
pooling on the WGSL kernels (lavapipe); all-MiniLM-L6-v2 (mean pooling, normalized) on the
CPU kernels through ``wick.Engine``; the API's input forms, base64 and errors."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.helpers import make_core

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SENTENCES = ["The lighthouse stood on the rocks for a hundred years.",
             "A ship passed in the night", "rocks", "the night the lighthouse stood"]
WORDS = ["the", "lighthouse", "stood", "on", "rocks", "for", "a", "hundred", "years", "ship",
         "passed", "in", "night", "."]


def _wordpiece(out: Path) -> None:
    """A small BERT tokenizer (lowercasing WordPiece, [CLS] text [SEP]) in out/."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.enable_padding(length=64)  # (as sentence-transformers exports often are: wick drops it)
    tok.save(str(out / "tokenizer.json"))


def _pooling_files(out: Path, mode: str, normalize: bool, max_len: int | None = None) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir(exist_ok=True)
    keys = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
            "max": "pooling_mode_max_tokens", "lasttoken": "pooling_mode_lasttoken"}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, **{k: k == keys[mode] for k in keys.values()}}))
    if max_len:
        (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_len}))


def _tiny_bert(out: Path, mode: str, normalize: bool) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(4)
    cfg = transformers.BertConfig(vocab_size=4 + len(WORDS), hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  max_position_embeddings=64)
    model = transformers.BertModel(cfg, add_pooling_layer=False)
    with torch.no_grad():  # (random token-type rows too: the conversion must add row 0)
        model.embeddings.token_type_embeddings.weight.normal_()
    model.save_pretrained(out)
    _wordpiece(out)
    _pooling_files(out, mode, normalize, max_len=32)
    return out


def _pooled(hidden: np.ndarray, mode: str, normalize: bool) -> np.ndarray:
    v = {"cls": hidden[0], "lasttoken": hidden[-1], "mean": hidden.mean(0),
         "max": hidden.max(0)}[mode]
    return v / max(np.linalg.norm(v), 1e-12) if normalize else v


def _embed(core, inputs: list[list[int]]) -> list[np.ndarray]:
    from wick.engine import EngineAPI

    api = EngineAPI(core)
    out = api.embeddings.create(input=inputs)
    return [np.array(d.embedding) for d in sorted(out.data, key=lambda d: d.index)]


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("mode,normalize", [("cls", False), ("max", True)])
def test_tiny_bert_matches_transformers(tmp_path, compiled, mode, normalize):
    src = _tiny_bert(tmp_path / "bert", mode, normalize)
    core = make_core(compiled(src, "q0f32", prefill_chunk_size=64, max_batch_size=4))
    assert core.info.task == "embed" and core.info.embedding["prefix_ids"] == [2]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.no_padding()
    ids = [tok.encode(s, add_special_tokens=False).ids for s in SENTENCES]
    got = _embed(core, ids)  # 4 inputs, batch bound 4: one step
    model = transformers.BertModel.from_pretrained(src).eval()
    for text_ids, vec in zip(ids, got):
        full = [2, *text_ids, 3]
        with torch.no_grad():
            hidden = model(torch.tensor([full])).last_hidden_state[0].numpy()
        ref = _pooled(hidden, mode, normalize)
        assert np.abs(vec - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())
        assert _cos(vec, ref) > 0.99999


def test_decoder_embedding_model_last_token(tmp_path, compiled):
    from tests.tiny_models import make_tiny_model

    src = make_tiny_model(tmp_path / "qwen3-embed", "qwen3", seed=5)
    _pooling_files(src, "lasttoken", True)
    core = make_core(compiled(src, "q0f32", prefill_chunk_size=64, max_batch_size=4))
    assert core.info.task == "embed" and core.info.embedding["pooling"] == "lasttoken"
    ids = [[5 + (7 * i + j) % 200 for j in range(3 + 5 * i)] for i in range(5)]
    got = _embed(core, ids)  # 5 inputs over a bound of 4: two steps
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    for seq, vec in zip(ids, got):
        with torch.no_grad():
            hidden = model.model(torch.tensor([seq])).last_hidden_state[0].numpy()
        assert _cos(vec, _pooled(hidden, "lasttoken", True)) > 0.99999


# ------------------------------------------------------------------ all-MiniLM-L6-v2, CPU kernels


@pytest.fixture(scope="module")
def minilm(minilm_path):
    from wick.server.local import Engine

    return Engine("all-minilm-l6-v2", device="cpu"), minilm_path


def test_minilm_matches_transformers_mean_pooling(minilm):
    engine, path = minilm
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval()
    texts = [*SENTENCES, "naïve café, ünïcode 🙂", "word " * 300]  # the last one: truncated
    enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    ref = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    out = engine.embeddings.create(input=texts)
    assert [d.index for d in out.data] == list(range(len(texts)))
    got = np.array([d.embedding for d in out.data])
    assert got.shape == (len(texts), 384)
    assert ((got * ref).sum(1) > 0.9999).all()
    counts = enc["attention_mask"].sum(1).tolist()
    assert counts[-1] == 256  # (truncated as sentence-transformers truncates)
    assert out.usage.prompt_tokens == out.usage.total_tokens == sum(counts)
    # token ids (without special tokens, as a client's tokenizer gives them) == the text
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts[:2]]
    b64 = engine.embeddings.create(input=ids, encoding_format="base64")
    decoded = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in b64.data])
    assert np.array_equal(decoded, got[:2].astype(np.float32))
    one = engine.embeddings.create(input=texts[0], model="all-minilm-l6-v2")
    assert np.array_equal(np.array(one.data[0].embedding), got[0])


def test_minilm_q8_within_cosine_0999_of_f32(minilm):
    from wick.server.local import Engine

    engine, _ = minilm
    q8 = Engine("all-minilm-l6-v2", quantization="q8f32_1", device="cpu")
    assert q8.core.info.quantization == "q8f32_1"
    f32 = np.array([d.embedding for d in engine.embeddings.create(input=SENTENCES).data])
    got = np.array([d.embedding for d in q8.embeddings.create(input=SENTENCES).data])
    cos = (f32 * got).sum(1)
    assert (cos > 0.999).all() and (cos < 0.999999).all(), cos  # (close, and quantized)


def test_minilm_request_errors(minilm):
    from wick.engine.errors import InvalidRequestError, ModelNotFoundError

    engine, _ = minilm
    for kwargs, param in (({"input": ""}, "input"), ({"input": []}, "input"),
                          ({"input": ["a", 3]}, "input"), ({"input": [[1, 2], []]}, "input"),
                          ({"input": [10**9]}, "input"), ({"input": "a", "dimensions": 128},
                                                          "dimensions"),
                          ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
                          ({"input": "a", "temperature": 1}, "temperature"), ({}, "input")):
        with pytest.raises(InvalidRequestError) as err:
            engine.embeddings.create(**kwargs)
        assert err.value.param == param and err.value.status == 400, kwargs
    with pytest.raises(InvalidRequestError) as err:
        engine.chat.completions.create(messages=[{"role": "user", "content": "hi"}])
    assert err.value.param == "model" and err.value.code == "model_not_generative"
    with pytest.raises(ModelNotFoundError):
        engine.embeddings.create(input="a", model="gpt-4")
    assert engine.embeddings.create(input="still fine").data[0].index == 0


def test_chat_model_refuses_embeddings(tiny_core):
    from wick.engine import EngineAPI
    from wick.engine.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as err:
        EngineAPI(tiny_core).embeddings.create(input="hello")
    assert err.value.param == "model" and err.value.code == "model_not_embedding"


def test_unsupported_pooling_files_are_named(tmp_path):
    from wick.compiler.embedding_files import sentence_transformers_config
    from wick.compiler.model_config import UnsupportedConfig

    src = tmp_path / "m"
    src.mkdir()
    _pooling_files(src, "mean", True)
    assert sentence_transformers_config(src) == {"pooling": "mean", "normalize": True,
                                                 "max_seq_length": None}
    modules = json.loads((src / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense",
                    "type": "sentence_transformers.models.Dense"})
    (src / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UnsupportedConfig, match="Dense"):
        sentence_transformers_config(src)
    shutil.rmtree(src / "1_Pooling")
    (src / "modules.json").write_text("[]")
    assert sentence_transformers_config(src) is None
