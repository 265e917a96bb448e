"""GGUF file -> HF-style config and HF-named float32 weights.

The tensors are dequantized with ``gguf.quants.dequantize`` (llama.cpp's block formats in numpy,
bit-exact). Then two things llama.cpp's converter did are undone:

- names: ``blk.N.attn_q.weight`` -> ``model.layers.N.self_attn.q_proj.weight`` and so on;
- for Llama (``GGUF_PERMUTED_QK`` of the family), the q/k projection rows: ``convert_hf_to_gguf.py`` reorders each head's rows from
  HF's rotate-half RoPE layout (first half, second half) to llama.cpp's interleaved pairs. Per head
  it viewed the rows as ``(2, head_dim/2)`` and transposed them to ``(head_dim/2, 2)``; we view
  them as ``(head_dim/2, 2)`` and transpose back.

Shapes: GGUF lists dimensions innermost first (``[in, out]`` for a linear); ``GGUFReader`` already
gives numpy arrays in row-major order, i.e. ``(out, in)``, which is HF's ``nn.Linear`` layout.

References: llama.cpp ``convert_hf_to_gguf.py`` (``LlamaModel.permute``) and
``gguf-py/gguf/constants.py`` (tensor and key names); transformers'
``modeling_gguf_pytorch_utils.py`` does the same reverse permutation.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from ..engine.errors import WickError
from .gguf_read import open_gguf
from .lazy_weights import LazyArray
from .rope_rows import pairs_to_halves
from .tokenizer_build import BuiltTokenizer, build_from_gguf


Progress = Callable[[str, int, int], None]  # (stage, done, total)

_LAYER = re.compile(r"blk\.(\d+)\.(.+)")
DEQUANTIZE_BLOCK_BYTES = 16 << 20  # the floats dequantized at a time
# YaRN's optional GGUF keys (rope.scaling.*) -> transformers' rope_scaling names (the first
# one present wins: llama.cpp's OLMo 3 converter writes the attention factor as attn_factor)
YARN_KEYS = {"yarn_attn_factor": "attention_factor", "attn_factor": "attention_factor",
             "yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow"}
ROPE_FREQS = "rope_freqs.weight"  # read into the config (rope_scaling), not a weight
# longrope's per-dimension factors (llama.cpp's Phi-3 converter), also config, not weights
ROPE_FACTORS = {"long_factor": "rope_factors_long.weight",
                "short_factor": "rope_factors_short.weight"}
NOT_WEIGHTS = {ROPE_FREQS, *ROPE_FACTORS.values()}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# metadata llama.cpp writes without the architecture's prefix (Apertus' xIELU scalars)
UNPREFIXED_KEYS = ("xielu.",)
# llama.cpp's layer tensor names shared by the families; each family adds or overrides its own
# (``GGUF_LAYER_NAMES`` in compiler/models/<family>.py)
COMMON_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def listed_name(names: dict[str, str], gguf_name: str) -> str | None:
    """``gguf_name``'s HF name in a table of them; a bias the table does not list is its
    weight's module's (``attn_output.bias`` -> ``self_attn.o_proj.bias`` where
    ``attn_output.weight`` -> ``self_attn.o_proj.weight``), as llama.cpp and transformers both
    name a bias after its module."""
    if gguf_name in names:
        return names[gguf_name]
    weight = names.get(gguf_name.removesuffix(".bias") + ".weight")
    if gguf_name.endswith(".bias") and weight is not None and weight.endswith(".weight"):
        return weight.removesuffix(".weight") + ".bias"
    return None


class GGUFFormatError(WickError):
    """The GGUF file is not one this loader understands; the message says which part."""

    default_status = 400
    default_type = "invalid_request_error"
    default_code = "unsupported_gguf"


class GGUFModel:
    """One open GGUF file: its metadata, config, tokenizer and (on demand) weights."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.reader = open_gguf(self.path)
        self.meta: dict[str, Any] = {k: f.contents() for k, f in self.reader.fields.items()}
        self.arch = self.meta.get("general.architecture")
        from .models import GGUF_ARCHITECTURES, family_for_gguf

        self.family = family_for_gguf(str(self.arch))
        if self.family is None:
            raise GGUFFormatError(
                f"{self.path}: architecture {self.arch!r} is not supported "
                f"(supported: {', '.join(sorted(GGUF_ARCHITECTURES))})"
            )
        with_experts = getattr(self.family, "GGUF_WITH_EXPERTS", None)
        if with_experts and any(t.name.endswith(".ffn_gate_inp.weight")
                                for t in self.reader.tensors):
            from .models import FAMILIES  # (llama.cpp writes Mixtral as llama, with experts)

            self.family = FAMILIES[with_experts]
        self.layer_names = {**COMMON_LAYER_NAMES, **self.family.GGUF_LAYER_NAMES}
        self.global_names = {**_GLOBAL_NAMES, **getattr(self.family, "GGUF_GLOBAL_NAMES", {})}
        self.tensor_types: dict[str, str] = {
            t.name: GGMLQuantizationType(t.tensor_type).name for t in self.reader.tensors
        }

    def tokenizer(self) -> BuiltTokenizer:
        return build_from_gguf(self.meta)

    def config(self) -> dict[str, Any]:
        """HF ``LlamaConfig``-style keys read from the ``<arch>.*`` metadata."""
        def key(name: str, default: Any = KeyError) -> Any:
            full = f"{self.arch}.{name}"
            if full in self.meta:
                return self.meta[full]
            if name.startswith(UNPREFIXED_KEYS) and name in self.meta:
                return self.meta[name]
            if default is KeyError:
                raise GGUFFormatError(f"{self.path}: metadata key {full!r} is missing")
            return default

        hidden = int(key("embedding_length"))
        heads = int(key("attention.head_count"))
        head_dim = int(key("attention.key_length", hidden // heads))
        rope_scaling = self._rope_scaling(key)
        if ROPE_FREQS in self.tensor_types:  # Llama 3.1+: llama3 scaling as divisors
            rope_scaling = self._llama3_scaling(float(key("rope.freq_base", 10000.0)), head_dim)
        if ROPE_FACTORS["long_factor"] in self.tensor_types:
            rope_scaling = self._longrope_scaling(key)
        rotary = int(key("rope.dimension_count", head_dim))
        vocab = key("vocab_size", None)
        if vocab is None:
            vocab = len(self.meta["tokenizer.ggml.tokens"])
        eos: int | list[int] | None = self.meta.get("tokenizer.ggml.eos_token_id")
        eot = self.meta.get("tokenizer.ggml.eot_token_id")
        if eot is not None and eos is not None and eot != eos:
            eos = [int(eos), int(eot)]
        bos = self.meta.get("tokenizer.ggml.bos_token_id")
        extra = getattr(self.family, "gguf_config", lambda key, tensors: {})(
            key, set(self.tensor_types))
        return extra | {
            "vocab_size": int(vocab),
            "hidden_size": hidden,
            "intermediate_size": int(key("feed_forward_length")),
            "num_hidden_layers": int(key("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(key("attention.head_count_kv", heads)),
            "head_dim": head_dim,
            # (a LayerNorm family's epsilon under the same name: DecoderConfig.layer_norm)
            "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", None)
                                  or key("attention.layer_norm_epsilon")),
            "rope_theta": float(key("rope.freq_base", 10000.0)),
            "rope_scaling": rope_scaling,
            "max_position_embeddings": int(key("context_length")),
            "tie_word_embeddings": "output.weight" not in self.tensor_types,
            "bos_token_id": None if bos is None else int(bos),
            "eos_token_id": eos if eos is None or isinstance(eos, list) else int(eos),
            "model_type": self.family.HF_MODEL_TYPES[0],
            "partial_rotary_factor": rotary / head_dim,
            "gguf_rotary_dim": rotary,  # (exact: the factor times head_dim may round below it)
        }

    def _rope_scaling(self, key: Callable[..., Any]) -> dict[str, Any] | None:
        kind = key("rope.scaling.type", None)
        if kind in (None, "none"):
            return None
        factor = float(key("rope.scaling.factor"))
        if kind == "linear":
            return {"rope_type": "linear", "factor": factor}
        if kind == "yarn":  # (llama.cpp's converter writes the optional ones where HF has them)
            scaling = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings":
                       int(key("rope.scaling.original_context_length"))}
            for name, hf_name in YARN_KEYS.items():
                if (value := key(f"rope.scaling.{name}", None)) is not None:
                    scaling.setdefault(hf_name, float(value))
            return scaling
        raise GGUFFormatError(f"{self.path}: rope.scaling.type={kind!r} is not supported")

    def _longrope_scaling(self, key: Callable[..., Any]) -> dict[str, Any]:
        """transformers' longrope parameters from llama.cpp's factor tensors and keys."""
        scaling: dict[str, Any] = {"rope_type": "longrope"}
        for name, tensor_name in ROPE_FACTORS.items():
            (tensor,) = [t for t in self.reader.tensors if t.name == tensor_name]
            scaling[name] = [float(f) for f in dequantize(
                tensor.data, GGMLQuantizationType(tensor.tensor_type)).reshape(-1)]
        scaling["original_max_position_embeddings"] = int(
            key("rope.scaling.original_context_length"))
        attention = key("rope.scaling.attn_factor", None)
        if attention is not None:
            scaling["attention_factor"] = float(attention)
        return scaling

    def _llama3_scaling(self, theta: float, head_dim: int) -> dict[str, Any]:
        from .rope_factors import NotLlama3Factors, llama3_scaling

        (tensor,) = [t for t in self.reader.tensors if t.name == ROPE_FREQS]
        divisors = dequantize(tensor.data, GGMLQuantizationType(tensor.tensor_type))
        try:
            return llama3_scaling(divisors, theta, head_dim)
        except NotLlama3Factors as err:
            raise GGUFFormatError(f"{self.path}: per-frequency RoPE factors ({ROPE_FREQS}) "
                                  f"that are not Llama 3's scaling ({err}) are not supported"
                                  ) from None

    def weights(
        self, config: dict[str, Any], progress: Progress | None = None
    ) -> dict[str, np.ndarray]:
        """Every tensor dequantized to float32, under its HF name, in HF layout: each a
        ``LazyArray`` dequantized when the compiler writes it (the shape is the header's; the
        family's own changes keep it)."""
        out: dict[str, np.ndarray] = {}
        tensors = self.reader.tensors
        for done, tensor in enumerate(tensors):
            if tensor.name in NOT_WEIGHTS:
                continue
            name = self.hf_name(tensor.name)
            shape = tuple(int(d) for d in reversed(tensor.shape))  # numpy order
            out[name] = LazyArray(functools.partial(self._hf_tensor, tensor, name, shape, config),
                                  shape, np.float32)
            if progress is not None:
                progress("dequantize", done + 1, len(tensors))
        self._check_complete(out, config)
        return out

    def _hf_tensor(self, tensor, name: str, shape: tuple[int, ...],
                   config: dict[str, Any]) -> np.ndarray:
        """One tensor as float32 in HF layout, dequantized a block of rows at a time into one
        array (gguf's dequantize takes about twice its output in temporaries: an 8 B model's
        head would have taken three times its 2 GB of floats)."""
        kind = GGMLQuantizationType(tensor.tensor_type)
        rows = tensor.data.reshape(-1, tensor.data.shape[-1])  # (a row: one output's blocks)
        width = shape[-1]
        array = np.empty((rows.shape[0], width), np.float32)
        step = max(1, DEQUANTIZE_BLOCK_BYTES // (4 * width))
        for start in range(0, rows.shape[0], step):
            array[start:start + step] = dequantize(rows[start:start + step], kind).reshape(-1, width)
        array = array.reshape(shape)
        array = getattr(self.family, "gguf_tensor", lambda n, a: a)(name, array)
        if self.family.GGUF_PERMUTED_QK and ".self_attn.q_proj." in name:
            array = pairs_to_halves(array, config["num_attention_heads"])
        elif self.family.GGUF_PERMUTED_QK and ".self_attn.k_proj." in name:
            array = pairs_to_halves(array, config["num_key_value_heads"])
        return array

    def hf_name(self, gguf_name: str) -> str:
        """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
        if (name := listed_name(self.global_names, gguf_name)) is not None:
            return name
        match = _LAYER.fullmatch(gguf_name)
        if match and (name := listed_name(self.layer_names, match.group(2))) is not None:
            return f"model.layers.{match.group(1)}.{name}"
        if match and "ffn_gate_inp.weight" in self.layer_names:  # (a family with experts)
            from .models.moe import gguf_legacy_expert_name

            if (name := gguf_legacy_expert_name(match.group(2))) is not None:
                return f"model.layers.{match.group(1)}.{name}"
        raise GGUFFormatError(f"{self.path}: GGUF tensor {gguf_name!r} has no known HF name "
                              f"in the {self.family.NAME} family")

    def _check_complete(self, weights: dict[str, np.ndarray], config: dict[str, Any]) -> None:
        """Every layer has a tensor for each name the file's layer 0 has, plus the globals."""
        expected = {"model.embed_tokens.weight", "model.norm.weight"}
        if not config["tie_word_embeddings"]:
            expected.add("lm_head.weight")
        first = {n.removeprefix("model.layers.0.") for n in weights
                 if n.startswith("model.layers.0.")}
        if config.get("num_experts"):  # (a layer's MLP: experts, or a dense one; the compile
            first = {n for n in first if not n.startswith("mlp.")}  # checks each layer's)
        # (a layer's first norm: the one before attention, or OLMo 2's after it)
        norms = getattr(self.family, "LAYER_NORMS", ("input_layernorm.weight",))
        for required in (norms[0], "self_attn.o_proj.weight"):
            first.add(required)
        for i in range(config["num_hidden_layers"]):
            expected |= {f"model.layers.{i}.{n}" for n in first}
        missing = sorted(expected - weights.keys())
        if missing:
            raise GGUFFormatError(f"{self.path}: tensors missing: {', '.join(missing[:8])}")

