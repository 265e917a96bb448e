"""Shared machinery of the end-to-end tests: build engine cores over compiled artifacts, drive
them to collect token ids, read logits through the Runner, and build the transformers references
(including one that holds exactly the weights stored in an artifact, dequantized)."""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from wick.engine.artifact import Artifact
from wick.engine.batch import Batch, KVIndex
from wick.engine.core import EngineCore
from wick.engine.model_info import ModelInfo
from wick.engine.runner import Runner
from wick.engine.sequence import SamplingParams
from wick.native.tokenizer import HFTokenizer

SMOLLM2 = "smollm2-135m-instruct"

# --------------------------------------------------------------------------------- loading


def load_artifact(art_dir: Path | str) -> Artifact:
    art_dir = Path(art_dir)
    return Artifact.load(lambda p: (art_dir / p).read_bytes(), str(art_dir))


def make_core(art_dir: Path | str, backend=None, *, num_pages: int = 64,
              **core_options) -> EngineCore:
    """An EngineCore over a fresh Runner of the artifact (what ``build_core`` does, with our
    page count). Each runner gets its own backend unless one is given."""
    from wick.native.grammar import grammar_for
    from wick.native.wgpu_backend import WgpuBackend

    art = load_artifact(art_dir)
    runner = Runner(art, backend or WgpuBackend.create(), num_pages=num_pages)
    tok = HFTokenizer(art.tokenizer_json())
    info = ModelInfo.from_manifest(art.manifest)
    grammar, vocab = grammar_for(art.tokenizer_json(), info.vocab_size, info.eos_token_ids)
    return EngineCore(runner, tok, info, num_pages=num_pages, grammar=grammar, vocab=vocab,
                      **core_options)


def sibling_core(core: EngineCore, **core_options) -> EngineCore:
    """Another core over the same runner (its own KV manager and scheduler), e.g. with a
    smaller prefill chunk. Never run two cores over one runner at the same time."""
    num_pages = core_options.pop("num_pages", core.runner.num_pages)
    assert num_pages <= core.runner.num_pages
    core_options.setdefault("grammar", core.grammar)
    core_options.setdefault("vocab", core.vocab)
    return EngineCore(core.runner, core.tokenizer, core.info, num_pages=num_pages, **core_options)


# --------------------------------------------------------------------------------- recording


@dataclass
class StepRecord:
    num_seqs: int
    num_tokens: int
    tokens_per_seq: list[int]
    sampled: list[int]


@dataclass
class Recorder:
    steps: list[StepRecord] = field(default_factory=list)
    plans: list[str] = field(default_factory=list)  # "forward" | "decode" | "decode1", per call

    @property
    def max_batch(self) -> int:
        return max((s.num_seqs for s in self.steps), default=0)

    @property
    def sampled(self) -> list[int]:
        return [t for s in self.steps for t in s.sampled]


@contextmanager
def record(runner: Runner) -> Iterator[Recorder]:
    """Record every ``runner.step`` (batch shape and sampled tokens) and which compiled plan
    each forward pass used. Patches instance attributes only; restores them on exit."""
    rec = Recorder()
    names = ("step", "forward", "decode", "decode1")
    saved = {name: runner.__dict__.get(name, _MISSING) for name in names}
    step = runner.step

    def recording_step(batch: Batch) -> list[int]:
        out = step(batch)
        qo = batch.kv.qo_indptr
        rec.steps.append(StepRecord(len(batch.seq_ids), batch.num_tokens,
                                    [qo[i + 1] - qo[i] for i in range(len(batch.seq_ids))],
                                    [getattr(t, "token", t) for t in out]))  # SampledToken
        return out

    class spy:  # the plan, noting each call under ``name`` (the runner keys steps by it too)
        def __init__(self, name, plan):
            self.label, self.plan = name, plan
            self.name, self.signature = plan.name, plan.signature

        def __call__(self, inputs, step=None):
            rec.plans.append(self.label)
            return self.plan(inputs, step)

    runner.step = recording_step
    for name in ("forward", "decode", "decode1"):
        setattr(runner, name, spy(name, getattr(runner, name)))
    try:
        yield rec
    finally:
        _restore(runner, saved)


@contextmanager
def forward_plan_only(runner: Runner) -> Iterator[None]:
    """Run one-token-per-sequence batches through the prefill (``forward``) plan too."""
    saved = {name: runner.__dict__.get(name, _MISSING) for name in ("decode", "decode1")}
    runner.decode = runner.decode1 = runner.forward
    try:
        yield
    finally:
        _restore(runner, saved)


_MISSING = object()


def _restore(obj, saved: dict) -> None:
    for name, value in saved.items():
        if value is _MISSING:
            obj.__dict__.pop(name, None)
        else:
            obj.__dict__[name] = value


# --------------------------------------------------------------------------------- driving


def run_core(core: EngineCore, prompts: Sequence[Sequence[int]],
             params: SamplingParams | Sequence[SamplingParams]) -> list[list[int]]:
    """Add all prompts as requests, step until every one is done; the sampled token ids of each
    (including a final stop token, as the engine counts it)."""
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    rids = [core.add_request(list(p), sp, prompt_param="prompt") for p, sp in zip(prompts, params)]
    out: dict[str, list[int]] = {rid: [] for rid in rids}
    while core.has_unfinished():
        for o in core.step():
            out[o.request_id].extend(o.token_ids)
    return [out[rid] for rid in rids]


def ids_of(n: int, seed: int) -> list[int]:
    """n byte tokens (no specials: ids 0..255 of the byte-level vocab)."""
    return np.random.default_rng(seed).integers(0, 256, size=n).tolist()


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def kv_cache_of(runner: Runner):
    """A fresh KV cache shaped like the runner's pools (two for Gemma-like models)."""
    from wick.engine.kv_cache import kv_cache_for

    return kv_cache_for(runner.page_size, runner.num_pages, window_pool=runner.window_pool,
                        num_window_pages=runner.num_window_pages)


def prefill_logits(runner: Runner, prompts: Sequence[Sequence[int]]) -> np.ndarray:
    """Last-position logits of each prompt, all prefilled together in one ragged step."""
    kv = kv_cache_of(runner)
    for i, p in enumerate(prompts):
        kv.allocate(i, len(p))
    batch = Batch(list(range(len(prompts))), [t for p in prompts for t in p],
                  kv.index_for([(i, 0, len(p)) for i, p in enumerate(prompts)]))
    return np.array(runner.read_logits(batch), dtype=np.float64)


def decode_logits(runner: Runner, prompts: Sequence[Sequence[int]]) -> np.ndarray:
    """Last-position logits of each prompt computed as a decode step: prefill all tokens but the
    last, then one step of one token per sequence (the runner's ``decode`` plan)."""
    kv = kv_cache_of(runner)
    for i, p in enumerate(prompts):
        kv.allocate(i, len(p))
    heads = [p[:-1] for p in prompts]
    runner.read_logits(Batch(list(range(len(prompts))), [t for h in heads for t in h],
                             kv.index_for([(i, 0, len(h)) for i, h in enumerate(heads)])))
    batch = Batch(list(range(len(prompts))), [p[-1] for p in prompts],
                  kv.index_for([(i, len(p) - 1, 1) for i, p in enumerate(prompts)]),
                  decode_only=True)
    return np.array(runner.read_logits(batch), dtype=np.float64)


def all_position_logits(runner: Runner, ids: Sequence[int]) -> np.ndarray:
    """Logits at every position of ``ids`` (row i predicts ids[i+1]).

    ``read_logits`` returns one row per sequence (its last new token), so every position is made
    its own one-token sequence, and all of them share one page table: the text's pages 0..k.
    Sequence i appends token i's K/V at slot i and attends to slots 0..i. Within a step every new
    token's K/V is appended before attention reads the pages (a token must see itself), so this is
    exactly a causal prefill of the text, ``max_batch`` positions per step. Needs
    ``runner.num_pages`` >= the page-table entries of a step (the ``page_values`` bound).
    """
    ps = runner.page_size
    rows: list[list[float]] = []
    for start in range(0, len(ids), runner.max_batch):
        positions = range(start, min(len(ids), start + runner.max_batch))
        page_values: list[int] = []
        page_indptr = [0]
        for pos in positions:
            page_values.extend(range(pos // ps + 1))
            page_indptr.append(len(page_values))
        assert len(page_values) <= runner.num_pages
        b = len(positions)
        kv = KVIndex(qo_indptr=list(range(b + 1)), page_indptr=page_indptr,
                     page_values=page_values, last_page_len=[p % ps + 1 for p in positions],
                     k_rope_pos_offset=[0] * b, q_positions=list(positions),
                     append_slots=list(positions))
        if runner.num_window_pages:  # the windowed layers' pool: the same pages, unslid
            assert len(ids) <= runner.num_window_pages * ps
            kv.window = KVIndex(**{f: getattr(kv, f) for f in (
                "qo_indptr", "page_indptr", "page_values", "last_page_len",
                "k_rope_pos_offset", "q_positions", "append_slots")})
        rows.extend(runner.read_logits(Batch(list(range(b)), [ids[p] for p in positions], kv)))
    return np.array(rows, dtype=np.float64)


def perplexity(logits: np.ndarray, ids: Sequence[int]) -> float:
    """exp(mean NLL of ids[1:]) from logits rows 0..n-2."""
    logits = np.asarray(logits, dtype=np.float64)[: len(ids) - 1]
    m = logits.max(axis=1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    nll = -logp[np.arange(len(ids) - 1), np.asarray(ids[1:])]
    return float(np.exp(nll.mean()))


# --------------------------------------------------------------------------------- references


def hf_logits(model, ids: Sequence[int]) -> np.ndarray:
    """Logits at every position (float64 numpy), transformers float32."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].double().numpy()


def hf_greedy(model, ids: Sequence[int], max_new_tokens: int, *, stop_at_eos: bool = False
              ) -> list[int]:
    """transformers ``generate(do_sample=False)``; ignores EOS unless ``stop_at_eos``."""
    import torch

    kwargs = {} if stop_at_eos else {"eos_token_id": None}
    x = torch.tensor([list(ids)])
    with torch.no_grad():  # an explicit mask: no prompt token is taken for padding
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=max_new_tokens,
                             pad_token_id=model.config.get_text_config().vocab_size - 1,
                             **kwargs)
    return out[0, len(ids):].tolist()


def hf_greedy_stepwise(model, ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens from transformers' forward with its KV cache, one token per call: what
    ``generate`` does, minus Phi-3's re-prefill of the whole sequence when it first passes the
    pretrained length (see compiler/models/longrope.py for why wick keeps its cache)."""
    import torch

    out_ids: list[int] = []
    with torch.no_grad():
        out = model(torch.tensor([list(ids)]), use_cache=True)
        for i in range(max_new_tokens):
            out_ids.append(int(out.logits[0, -1].argmax()))
            out = model(torch.tensor([[out_ids[-1]]]), past_key_values=out.past_key_values,
                        use_cache=True, position_ids=torch.tensor([[len(ids) + i]]))
    return out_ids


_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "uint32": np.uint32,
              "int32": np.int32}


def artifact_weights(art: Artifact) -> dict[str, np.ndarray]:
    """The artifact's stored parameters as float32 arrays, packed triples dequantized with
    ``dequantize`` and row-split ``parts.K`` concatenated back: compiled-module names."""
    from wick.compiler.quantization import dequantize

    shards = dict(art.shard_bytes())
    raw = {}
    for p in art.params:
        count = int(np.prod(p.shape))
        raw[p.name] = np.frombuffer(shards[p.shard], dtype=_NP_DTYPES[p.dtype], count=count,
                                    offset=p.offset).reshape(p.shape)
    plain: dict[str, np.ndarray] = {}
    for name, value in raw.items():
        if name.endswith((".weight_scale", ".weight_min")):
            continue
        if name.endswith(".weight_q"):
            base = name[: -len("_q")]
            plain[base] = dequantize(value, raw[base + "_scale"], raw[base + "_min"])
        else:
            plain[name] = value.astype(np.float32)
    parts: dict[str, list[tuple[int, np.ndarray]]] = {}
    out: dict[str, np.ndarray] = {}
    for name, value in plain.items():
        m = re.fullmatch(r"(.*)\.parts\.(\d+)\.(weight)", name)
        if m:
            parts.setdefault(f"{m.group(1)}.{m.group(3)}", []).append((int(m.group(2)), value))
        else:
            out[name] = value
    for name, pieces in parts.items():
        out[name] = np.concatenate([v for _, v in sorted(pieces, key=lambda kv: kv[0])])
    return out


def hf_state_from_artifact(art: Artifact, config) -> dict[str, "object"]:
    """HF Llama state dict (torch float32) holding exactly the artifact's weights."""
    import torch

    w = artifact_weights(art)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q_dim = config.num_attention_heads * head_dim
    kv_dim = config.num_key_value_heads * head_dim
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    sd = {"model.embed_tokens.weight": t(w["model.embed_tokens.table.weight"]),
          "model.norm.weight": t(w["model.norm.weight"])}
    if "lm_head.weight" in w:
        sd["lm_head.weight"] = t(w["lm_head.weight"])
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        q, k, v = np.split(w[p + "self_attn.qkv_proj.weight"], [q_dim, q_dim + kv_dim])
        sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"] = t(q), t(k)
        sd[p + "self_attn.v_proj.weight"] = t(v)
        sd[p + "self_attn.o_proj.weight"] = t(w[p + "self_attn.o_proj.weight"])
        gate, up = np.split(w[p + "mlp.gate_up_proj.weight"], 2)
        sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"] = t(gate), t(up)
        sd[p + "mlp.down_proj.weight"] = t(w[p + "mlp.down_proj.weight"])
        for name in w:  # every norm of the layer (Gemma has four, Qwen3 and Gemma 3 q/k norms)
            if name.startswith(p) and name.endswith("norm.weight"):
                sd[name] = t(w[name])
        for name in ("self_attn.qkv_proj.bias",):
            if p + name in w:
                q, k, v = np.split(w[p + name], [q_dim, q_dim + kv_dim])
                sd[p + "self_attn.q_proj.bias"], sd[p + "self_attn.k_proj.bias"] = t(q), t(k)
                sd[p + "self_attn.v_proj.bias"] = t(v)
    if art.model["family"].startswith("gemma"):  # stored as 1 + w (compiler/models/gemma2.py)
        sd = {k: v - 1.0 if k.endswith("norm.weight") else v for k, v in sd.items()}
    return sd


def hf_model_from_artifact(art: Artifact, like):
    """A deep copy of the transformers model ``like`` with the artifact's weights loaded."""
    import copy

    model = copy.deepcopy(like)
    sd = hf_state_from_artifact(art, model.config)
    result = model.load_state_dict(sd, strict=False)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    missing = [k for k in result.missing_keys if not (tied and k == "lm_head.weight")]
    assert not missing and not result.unexpected_keys, (missing, result.unexpected_keys)
    if tied:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model.eval()


@contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Within this block transformers parses each GGUF file once. Its loaders read a GGUF
    with ``gguf.GGUFReader`` (pure Python) once for the config, again for the weights and again
    for a tokenizer; a large vocabulary makes each parse slow (Gemma 3's 262k tokens: ~15 s on
    CI). The reader only maps the file and reads it, so one reader serves every load; it is
    wick's ``FastGGUFReader``, the package's reader with a faster ``_get`` (the same parse, 4x
    faster; tests/compiler/test_gguf_read.py compares the two). transformers also builds gguf's
    table of tensor names (``get_tensor_name_map``, the same for each architecture and depth,
    only read) once per submodule of the model: 319 times for Qwen2.5-0.5B, ~7 s; here once."""
    import functools

    import gguf

    from wick.compiler.gguf_read import FastGGUFReader

    real = gguf.GGUFReader
    # nested in another such block: that block's readers serve this one too
    make = real if getattr(real, "parses_once", False) else FastGGUFReader
    readers: dict = {}

    def reader(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = make(path, mode)
        return readers[key]

    reader.parses_once = True

    real_names = gguf.get_tensor_name_map
    gguf.GGUFReader = reader  # transformers imports both from gguf at each load
    if not hasattr(real_names, "cache_info"):
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(real_names)
    try:
        yield
    finally:
        gguf.GGUFReader = real
        gguf.get_tensor_name_map = real_names


# image-and-text checkpoints that transformers' AutoModelForCausalLM does not take
IMAGE_TEXT_ONLY = ("mistral3", "qwen2_5_vl", "qwen3_vl")


def load_hf(path: Path | str, **kwargs):
    """transformers' model of ``path`` in float32: its causal LM, or for an image-and-text
    checkpoint without one (Mistral 3, Qwen-VL), its ForConditionalGeneration (text in, logits out)."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    config = Path(path) / "config.json"
    kind = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    auto = AutoModelForImageTextToText if kind in IMAGE_TEXT_ONLY else AutoModelForCausalLM
    with gguf_parsed_once():
        return auto.from_pretrained(str(path), dtype=torch.float32, **kwargs).eval()


def load_hf_gguf(path: Path):
    """transformers' model (float32) and tokenizer from the GGUF file ``path``, its metadata
    parsed once for both."""
    from transformers import AutoTokenizer

    with gguf_parsed_once():
        return (load_hf(path.parent, gguf_file=path.name),
                AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))
