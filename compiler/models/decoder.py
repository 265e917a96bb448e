"""The pre-norm decoder most families are: embed -> N x (norm, attention, norm, gated MLP) ->
norm -> LM head, over wick's paged attention. A family file configures it (``DecoderConfig``)
and, where it differs, overrides one piece (``Attention.project``, ``Layer``, ``embed``...).

Weights are stored fused, as MLC-LLM does: one ``qkv_proj`` (q rows, then k, then v) and one
``gate_up_proj`` per layer, so a layer is two GEMMs fewer. ``fuse_layer_weights`` builds them
from HF's separate projections.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from ...engine.step_inputs import STEP_INPUTS, WINDOW_INPUTS, WINDOW_PREFIX
from ..hf_source import rope_settings
from ..model_config import UnsupportedConfig, check_config
from ..quantization import Quantization
from .layers import MAX_BINDING_BYTES, QEmbedding, QLinear, take_rows
from .paged_attention import AttentionSpec, PagedAttention
from .pooling import pool

KV_PAGES = "kv_pages"  # forward's per-layer KV tensors (engine/runner.py reads their shapes)
# the page-count dimension of a layer's KV tensor (the runner sizes each pool by these names)
from ...engine.runner import MAIN_POOL, WINDOW_POOL  # noqa: E402


@dataclass
class DecoderConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    context_window: int
    tie_word_embeddings: bool
    rope_scaling: dict[str, Any] | None = None
    qkv_bias: bool = False  # biases on q, k, v (Qwen2)
    o_bias: bool = False  # bias on the output projection (Llama attention_bias)
    mlp_bias: bool = False  # biases on gate, up, down (Llama mlp_bias)
    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE (Qwen3, Gemma 3)
    sliding_window: int | None = None  # every layer's window (Mistral, Phi-3), if any
    rotary_dim: int | None = None  # partial rotary: RoPE on the first dimensions only (Phi-3.5)
    # LayerNorm (mean and variance, with a bias) for a layer's norms and the final one, instead
    # of RMSNorm (StableLM, Phi-2); its epsilon is ``rms_norm_eps`` all the same
    layer_norm: bool = False
    head_bias: bool = False  # a bias on the LM head (Phi-2)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides: Any) -> "DecoderConfig":
        check_config(hf)
        heads = int(hf["num_attention_heads"])
        head_dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)
        theta, scaling = rope_settings(hf)
        partial = float(hf.get("partial_rotary_factor")
                        or (hf.get("rope_parameters") or {}).get("partial_rotary_factor") or 1.0)
        # (truncated, as transformers' attention does; a GGUF's config says it outright)
        rotary_dim = int(hf.get("gguf_rotary_dim") or head_dim * partial)
        context = int(hf.get("max_position_embeddings", 2048))
        if scaling and scaling.get("rope_type") == "dynamic" and not scaling.get("alpha"):
            # dynamic NTK (InternLM3, Llama 2 fine-tunes): transformers stretches RoPE's base
            # only for sequences past max_position_embeddings (which stays the context window),
            # so within it this is plain RoPE, exactly
            scaling = None
        scaling = kernel_rope_scaling(scaling, hf, rotary_dim, theta)
        values = dict(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_hidden_layers=int(hf["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=config_value(hf, "rms_norm_eps", 1e-6),
            rope_theta=theta,
            context_window=context,
            tie_word_embeddings=config_value(hf, "tie_word_embeddings", False, bool),
            rope_scaling=scaling,
            rotary_dim=rotary_dim if rotary_dim != head_dim else None,
        )
        if hf.get("embedding"):  # an embedding model's pooling (compiler/embedding_files.py)
            values["extra"] = {"embedding": hf["embedding"]}
        values.update(overrides)
        return cls(**values)

    def attention(self, layer: int, dtype: str) -> AttentionSpec:
        """Layer ``layer``'s attention; every layer the same unless a family says otherwise."""
        return AttentionSpec(self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                             dtype, self.rope_theta, self.rope_scaling,
                             window=effective_window(self.sliding_window, self.context_window),
                             rotary_dim=self.rotary_dim)


ROPE_SCALINGS = ("linear", "llama3", "longrope", "yarn")


def kernel_rope_scaling(scaling: dict[str, Any] | None, hf: dict[str, Any], rotary_dim: int,
                        theta: float) -> dict[str, Any] | None:
    """A config's RoPE scaling (hf_source.rope_settings') as the attention kernels take it:
    longrope and YaRN as their per-dimension factor tables (compiler/models/longrope.py);
    any other kind refused in words."""
    if not scaling:
        return None
    scaling = dict(scaling)
    if scaling["rope_type"] == "su":  # Phi-3's first name for longrope
        scaling["rope_type"] = "longrope"
    if scaling["rope_type"] not in ROPE_SCALINGS:
        raise UnsupportedConfig(f"rope_scaling type {scaling['rope_type']!r} is not supported "
                                f"(wick has {', '.join(ROPE_SCALINGS)})")
    if scaling["rope_type"] == "longrope":
        from .longrope import longrope_settings

        return longrope_settings(scaling, hf, rotary_dim)
    if scaling["rope_type"] == "yarn":
        from .longrope import yarn_settings

        return yarn_settings(scaling, hf, rotary_dim, theta)
    return scaling


def with_default_theta(hf: dict[str, Any], theta: float) -> dict[str, Any]:
    """``hf`` with the family's RoPE base where it names none (transformers' ``default_theta``
    of its config class)."""
    named = hf.get("rope_theta") if hf.get("rope_theta") is not None else (
        hf.get("rope_parameters") or {}).get("rope_theta")
    return hf if named is not None else {**hf, "rope_theta": float(theta)}


def config_value(hf: dict[str, Any], key: str, default: Any, kind: Callable[[Any], Any] = float
                 ) -> Any:
    """``hf[key]`` as ``kind``, or ``default`` where the config has no value for it (absent or
    null): the family's own default, as its transformers config class has it."""
    value = hf.get(key)
    return default if value is None else kind(value)


def tied_head(hf: dict[str, Any], default: bool) -> bool:
    """Whether the LM head is the embedding: the config's word, else the family's default."""
    return config_value(hf, "tie_word_embeddings", default, bool)


def layer_norm_eps(hf: dict[str, Any], key: str) -> float:
    """A LayerNorm family's epsilon under its own config key (its gguf_config puts llama.cpp's
    there too), else transformers' default for all of them, 1e-5."""
    return config_value(hf, key, 1e-5)


def with_partial_rotary(hf: dict[str, Any], default: float) -> dict[str, Any]:
    """``hf`` with the family's default ``partial_rotary_factor`` where it names none."""
    if hf.get("partial_rotary_factor") is not None or \
            (hf.get("rope_parameters") or {}).get("partial_rotary_factor") is not None:
        return hf
    return {**hf, "partial_rotary_factor": default}


class LayerwiseConfig(DecoderConfig):
    """A config whose layers differ, one entry a layer in ``extra``: ``sliding`` (windowed by
    ``sliding_window``, else global) and ``rope`` (whether the layer applies RoPE; absent: all
    do); and, where each kind of layer has a RoPE of its own, ``rope_by_kind`` (sliding? ->
    (theta, scaling): ``rope_by_kind``)."""

    def attention(self, layer: int, dtype: str) -> AttentionSpec:
        sliding = self.extra["sliding"][layer]
        window = effective_window(self.sliding_window, self.context_window) if sliding else None
        theta, scaling = self.extra.get("rope_by_kind", {}).get(
            sliding, (self.rope_theta, self.rope_scaling))
        rope = self.extra["rope"][layer] if "rope" in self.extra else True
        return AttentionSpec(self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                             dtype, theta, scaling, window=window, rotary_dim=self.rotary_dim,
                             rope=rope)


def rope_by_kind(hf: dict[str, Any], rotary_dim: int, local_theta: float | None = None,
                 default_theta: float = 10000.0
                 ) -> dict[bool, tuple[float, dict[str, Any] | None]]:
    """sliding? -> (theta, kernel scaling) for models whose windowed and global layers rotate
    differently: transformers 5 nests ``rope_parameters`` per layer kind; a 4.x config's
    ``rope_theta`` + ``rope_scaling`` are the global layers', the windowed ones plain RoPE at
    ``local_theta`` (default: the same theta). ``default_theta``: the family's where a config
    (or a kind) names none."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        # (each kind's dict is a rope_parameters of its own: theta, type and its keys)
        kinds = {sliding: rope_settings({"rope_parameters": {
                     "rope_theta": default_theta, **(params.get(kind) or {})}})
                 for sliding, kind in ((False, "full_attention"), (True, "sliding_attention"))}
    else:
        theta, scaling = rope_settings(with_default_theta(hf, default_theta))
        kinds = {False: (theta, scaling),
                 True: (theta if local_theta is None else float(local_theta), None)}
    return {sliding: (theta, kernel_rope_scaling(scaling, hf, rotary_dim, theta))
            for sliding, (theta, scaling) in kinds.items()}


def effective_window(window: int | None, context_window: int) -> int | None:
    """None when the window never hides a key (it spans the whole context): such layers run
    the faster global kernel and are exact all the same."""
    if window is None or int(window) >= context_window:
        return None
    return int(window)


def rms_norm(size: int, c: DecoderConfig, dtype: str) -> nn.RMSNorm:
    return nn.RMSNorm(size, -1, c.rms_norm_eps, bias=False, dtype=dtype)


def block_norm(size: int, c: DecoderConfig, dtype: str) -> nn.Module:
    """A layer's norm before (or after) a block, and the final norm: the family's kind."""
    if c.layer_norm:
        return nn.LayerNorm(size, c.rms_norm_eps, dtype=dtype)
    return rms_norm(size, c, dtype)


class Attention(nn.Module):
    def __init__(self, c: DecoderConfig, attn: PagedAttention, quant: Quantization) -> None:
        self.attn = attn
        self.num_q, self.num_kv = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = c.head_dim
        qkv_heads = self.num_q + 2 * self.num_kv
        self.qkv_proj = QLinear(c.hidden_size, qkv_heads * c.head_dim, quant, bias=c.qkv_bias)
        self.o_proj = QLinear(self.num_q * c.head_dim, c.hidden_size, quant, bias=c.o_bias)
        if c.qk_norm:
            self.q_norm = rms_norm(c.head_dim, c, quant.dtype)
            self.k_norm = rms_norm(c.head_dim, c, quant.dtype)
        self.qk_norm = c.qk_norm

    def project(self, x: Tensor) -> Tensor:
        """x (n, hidden) -> fused q|k|v (n, hq + 2*hkv, head_dim), before RoPE."""
        n = x.shape[0]
        qkv = op.reshape(self.qkv_proj(x), (n, self.num_q + 2 * self.num_kv, self.head_dim))
        if not self.qk_norm:
            return qkv
        q, k, v = op.split(qkv, [self.num_q, self.num_q + self.num_kv], axis=1)
        return op.concat([self.q_norm(q), self.k_norm(k), v], dim=1)

    def forward(self, x: Tensor, pages: Tensor, step: dict[str, Tensor]) -> Tensor:
        return self.o_proj(self.attn(self.project(x), pages, step))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); SiLU unless the family says otherwise."""

    def __init__(self, c: DecoderConfig, quant: Quantization,
                 act: Callable[[Tensor], Tensor] = op.silu) -> None:
        self.act = act
        self.gate_up_proj = QLinear(c.hidden_size, 2 * c.intermediate_size, quant, bias=c.mlp_bias)
        self.down_proj = QLinear(c.intermediate_size, c.hidden_size, quant, bias=c.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = op.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(self.act(gate) * up)


def gelu_tanh(x: Tensor) -> Tensor:
    return op.gelu(x, approximate="tanh")


# transformers' activation names (its ACT2FN) a plain MLP may name -> the function
PLAIN_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": op.gelu, "gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh, "gelu_fast": gelu_tanh,
    "relu": op.relu, "relu2": lambda x: op.square(op.relu(x)),
}


def plain_activation(name: str, key: str, family: str) -> str:
    """``name`` (a config's ``key``), refused in words where wick has no such activation."""
    if name not in PLAIN_ACTIVATIONS:
        raise UnsupportedConfig(f"{key} {name!r} in a {family} config is not supported (wick "
                                f"has {', '.join(PLAIN_ACTIVATIONS)})")
    return name


class PlainMLP(nn.Module):
    """down(act(up(x))), with biases unless ``bias`` is false; ``act`` a PLAIN_ACTIVATIONS
    name."""

    def __init__(self, c: DecoderConfig, quant: Quantization, act: str, bias: bool = True) -> None:
        self.act = PLAIN_ACTIVATIONS[act]
        self.up_proj = QLinear(c.hidden_size, c.intermediate_size, quant, bias=bias)
        self.down_proj = QLinear(c.intermediate_size, c.hidden_size, quant, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.up_proj(x)))


class SequentialLayer(nn.Module):
    """``h + attention(norm(h))``, then ``h + mlp(norm(h))``: the usual pre-norm layer, with
    the family's attention and MLP."""

    def __init__(self, c: DecoderConfig, self_attn: nn.Module, mlp: nn.Module, dtype: str) -> None:
        self.input_layernorm = block_norm(c.hidden_size, c, dtype)
        self.self_attn = self_attn
        self.post_attention_layernorm = block_norm(c.hidden_size, c, dtype)
        self.mlp = mlp

    def forward(self, h: Tensor, pages: Tensor, step: dict[str, Tensor]) -> Tensor:
        h = h + self.self_attn(self.input_layernorm(h), pages, step)
        return h + self.mlp(self.post_attention_layernorm(h))


class Layer(SequentialLayer):
    """The Llama layer: attention, then a gated MLP."""

    def __init__(self, c: DecoderConfig, attn: PagedAttention, quant: Quantization) -> None:
        super().__init__(c, Attention(c, attn, quant), GatedMLP(c, quant), quant.dtype)


class Body(nn.Module):
    def __init__(self, c: DecoderConfig, layers: list[nn.Module], quant: Quantization,
                 max_param_bytes: int) -> None:
        # Only the vocabulary-sized tables can outgrow a storage binding in practice.
        self.embed_tokens = QEmbedding(c.vocab_size, c.hidden_size, quant, max_param_bytes)
        self.layers = nn.ModuleList(layers)
        self.norm = block_norm(c.hidden_size, c, quant.dtype)


class DecoderForCausalLM(nn.Module):
    """The compiled model: ``forward(*step inputs, kv_pages)`` -> logits (b, vocab) float32.

    Families subclass it to change ``make_layer``, ``embed`` or ``final_logits``."""

    def __init__(self, c: DecoderConfig, quant: Quantization, target,
                 max_param_bytes: int = MAX_BINDING_BYTES) -> None:
        self.config, self.quant, self.max_param_bytes = c, quant, max_param_bytes
        kernels: dict[AttentionSpec, PagedAttention] = {}  # one set of kernels per distinct spec
        shared: dict = {}
        self.layer_attention = []
        for i in range(c.num_hidden_layers):
            spec = c.attention(i, quant.dtype)
            if spec not in kernels:
                tag = f"_{len(kernels)}" if kernels else ""
                kernels[spec] = PagedAttention(spec, target, tag, shared)
            self.layer_attention.append(kernels[spec])
        layers = [self.layer_for(i, c, attn, quant) for i, attn in enumerate(self.layer_attention)]
        self.model = Body(c, layers, quant, max_param_bytes)
        # an embedding model (e.g. Qwen3-Embedding): pooled final hidden states, no LM head
        self.embedding = c.extra.get("embedding")
        self.task = "embed" if self.embedding else "generate"
        if not c.tie_word_embeddings and not self.embedding:
            self.lm_head = QLinear(c.hidden_size, c.vocab_size, quant, max_param_bytes,
                                   bias=c.head_bias)
        windows = {attn.shape.window for attn in self.layer_attention}
        # global and windowed layers: the windowed ones get a pool of their own
        self.paired = None in windows and len(windows) > 1
        self.step_inputs = STEP_INPUTS + (WINDOW_INPUTS if self.paired else ())
        # export_tvm names the compiled function's inputs after the Python parameters: the
        # step entry points take the step inputs' names (engine/step_inputs.py)
        step = _with_signature(self._step, [i.name for i in self.step_inputs] + [KV_PAGES])
        self.forward = step
        self.decode = step  # the same step compiled for one token per sequence (n == b)
        self.decode1 = step  # ... and for a single sequence (kernels padded to one row)

    def kv_window(self) -> int | None:
        """The window when every layer has the same one (the KV cache may then free the pages
        behind it; engine/kv_cache.py), else None."""
        windows = {attn.shape.window for attn in self.layer_attention}
        return windows.pop() if len(windows) == 1 else None

    def window_pool(self) -> int | None:
        """The windowed layers' window in a model that also has global layers."""
        if not self.paired:
            return None
        (window,) = {a.shape.window for a in self.layer_attention} - {None}
        return window

    def gpu_twins(self, target, decode: bool = False) -> dict:
        """TIR function name -> each attention kernel for another GPU ``target`` (for the
        ``decode`` plans: PagedAttention.gpu_twins)."""
        twins: dict = {}
        for attn in dict.fromkeys(self.layer_attention):
            twins.update(attn.gpu_twins(target, decode))
        return twins

    def cpu_twins(self) -> dict:
        """TIR function name -> the CPU twin of each GPU-only kernel (compiler/targets/cpu.py)."""
        twins: dict = {}
        for attn in dict.fromkeys(self.layer_attention):
            twins.update(attn.cpu_twins())
        return twins

    def make_layer(self, c: DecoderConfig, attn: PagedAttention, quant: Quantization) -> nn.Module:
        return Layer(c, attn, quant)

    def layer_for(self, index: int, c: DecoderConfig, attn: PagedAttention,
                  quant: Quantization) -> nn.Module:
        """Layer ``index``: ``make_layer``'s, where a family's layers do not differ by their
        index (a mixture-of-experts model's dense layers do: compiler/models/moe.py)."""
        return self.make_layer(c, attn, quant)

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.model.embed_tokens(input_ids)

    def embed_step(self, step: dict[str, Tensor]) -> Tensor:
        """The step's first hidden states: its tokens' embeddings (GPT-2 adds its positions')."""
        return self.embed(step["input_ids"])

    def final_logits(self, logits: Tensor) -> Tensor:
        return logits

    def _step(self, *args: Tensor) -> Tensor:
        """One engine step over a ragged batch -> logits (b, vocab) float32."""
        *inputs, kv_pages = args
        step = {spec.name: t for spec, t in zip(self.step_inputs, inputs)}
        # the windowed layers of a paired model read their own pool's arrays
        local = {**step, **{name[len(WINDOW_PREFIX):]: t for name, t in step.items()
                            if name.startswith(WINDOW_PREFIX)}}
        h = self.embed_step(step)  # (n, hidden)
        for layer, attn, layer_pages in zip(self.model.layers, self.layer_attention, kv_pages):
            h = layer(h, layer_pages, local if self._in_window_pool(attn) else step)
        if self.embedding:
            return pool(self.model.norm(h), step["qo_indptr"], step["logit_positions"],
                        self.embedding["pooling"], self.embedding["normalize"])
        h = self.model.norm(take_rows(h, step["logit_positions"]))  # (b, hidden)
        head = self.model.embed_tokens.lm_head if self.config.tie_word_embeddings else self.lm_head
        return self.final_logits(op.astype(head(h), "float32"))

    def _in_window_pool(self, attn: PagedAttention) -> bool:
        return self.paired and attn.shape.window is not None

    def forward_spec(self, **sizes: int | str) -> dict[str, Any]:
        """Input specs of one step. ``n="b"`` gives the decode variant (one new token per
        sequence); ``n=1, b=1, b1=2`` the single-sequence decode with static shapes."""
        spec = {i.name: nn.spec.Tensor([sizes.get(d, d) for d in i.dims], i.dtype)
                for i in self.step_inputs}
        spec[KV_PAGES] = [attn.page_spec(WINDOW_POOL if self._in_window_pool(attn)
                                         else MAIN_POOL) for attn in self.layer_attention]
        return spec


def _with_signature(method, names: list[str]):
    """``method`` as a function whose parameters are called ``names``."""
    def step(*args):
        return method(*args)

    step.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    return step


# ----------------------------------------------------------------------------- weights

def renamed_weights(weights: dict[str, np.ndarray], renames: dict[str, str]
                    ) -> dict[str, np.ndarray]:
    """``weights`` with each name's parts replaced by ``renames`` (old part -> new part): a
    family whose checkpoint names its modules its own way reads them under the decoder's."""
    out = {}
    for name, w in weights.items():
        for old, new in renames.items():
            name = name.replace(old, new)
        out[name] = w
    return out


LAYER_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")


def fuse_layer_weights(c: DecoderConfig, weights: dict[str, np.ndarray],
                       extra: tuple[str, ...] = (), norms: tuple[str, ...] = LAYER_NORMS
                       ) -> dict[str, np.ndarray]:
    """HF parameter names -> this module's (fused qkv and gate_up, biases when present).
    ``norms`` (a pre-norm layer's two) and ``extra`` (e.g. ``self_attn.q_norm.weight``):
    per-layer names copied as they are; with ``c.layer_norm``, the norms' biases too."""
    out: dict[str, np.ndarray] = {"model.embed_tokens.table.weight": weights["model.embed_tokens.weight"],
                                  "model.norm.weight": weights["model.norm.weight"]}
    if c.layer_norm:
        out["model.norm.bias"] = weights["model.norm.bias"]
        norms = norms + tuple(n.removesuffix(".weight") + ".bias" for n in norms)
    if not c.tie_word_embeddings and not c.extra.get("embedding"):
        out["lm_head.weight"] = weights["lm_head.weight"]
        if c.head_bias:
            out["lm_head.bias"] = weights["lm_head.bias"]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        for kind in ("weight", "bias"):
            if attn + "qkv_proj." + kind in weights:  # already fused (Phi-3)
                out[attn + "qkv_proj." + kind] = weights[attn + "qkv_proj." + kind]
            elif attn + "q_proj." + kind in weights:
                out[attn + "qkv_proj." + kind] = np.concatenate(
                    [weights[attn + x + "_proj." + kind] for x in "qkv"])
            if mlp + "gate_up_proj." + kind in weights:
                out[mlp + "gate_up_proj." + kind] = weights[mlp + "gate_up_proj." + kind]
            elif mlp + "gate_proj." + kind in weights:
                out[mlp + "gate_up_proj." + kind] = np.concatenate(
                    [weights[mlp + "gate_proj." + kind], weights[mlp + "up_proj." + kind]])
            elif mlp + "up_proj." + kind in weights:  # a plain MLP (Phi-2, GPT-NeoX)
                out[mlp + "up_proj." + kind] = weights[mlp + "up_proj." + kind]
            for name in (attn + "o_proj." + kind, mlp + "down_proj." + kind):
                if name in weights:
                    out[name] = weights[name]
        for name in (*norms, *extra):
            out[p + name] = weights[p + name]
    return out
