"""Mixture-of-experts models beyond test_families.py's parity on q0f32 (Qwen3-MoE, Mixtral,
Qwen2-MoE, OLMoE): the packed expert kernels of the CPU kernel set, their stacks split across
bindings, against transformers on the same dequantized weights; and which layers have experts,
and how many a token gets, read as transformers reads a config."""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.conftest import TINY_OPTIONS
from tests.e2e.family_models import family_model
from tests.e2e.helpers import hf_logits, load_artifact, load_hf, make_core, prefill_logits

PROMPTS = [[5, 9, 20, 31, 7, 100, 64, 3, 8, 77, 12, 40, 41], [40, 41, 42]]


def _dequantized_in_place(model, quantization: str) -> None:
    """Every weight wick packs (linears, stacked experts, the embedding) replaced by its
    packed-then-unpacked value; the routers and norms, which wick keeps as they are, left."""
    import torch

    from wick.compiler.quantization import dequantize, get_quantization, quantize

    quant = get_quantization(quantization)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2 or name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):
                continue
            w = p.detach().numpy()
            rows = w.reshape(-1, w.shape[-1])  # (an expert stack: each expert's rows alike)
            p.copy_(torch.from_numpy(dequantize(*quantize(rows, quant)).reshape(w.shape)))


@pytest.mark.parametrize("kernel_set,quantization", [
    ("cpu", "q4f32_1"), ("cpu", "q8f32_1"), ("webgpu", "q4f32_1")])
def test_packed_experts_split_across_bindings_match_transformers(kernel_set, quantization,
                                                                 tmp_path_factory, compiled):
    """Qwen2-MoE (routed experts and a shared one) in 4 and 8 bits on the CPU kernel set and
    in 4 bits on WebGPU's (compiler/expert_gemv.py's schedule, on lavapipe), with bindings of
    4 KiB: each expert stack is split by rows into parts."""
    from wick.native.cpu_backend import CpuBackend

    path = family_model(tmp_path_factory.mktemp("tiny-qwen2-moe-packed"), "qwen2_moe")
    art_dir = compiled(path, quantization, kernel_sets=(kernel_set,), max_param_bytes=4096,
                       **TINY_OPTIONS)
    names = [p["name"] for p in load_artifact(art_dir).manifest["params"]]
    assert "model.layers.0.mlp.experts.gate_up_proj.parts.1.weight_q" in names
    core = make_core(art_dir, CpuBackend.create() if kernel_set == "cpu" else None)
    ours = prefill_logits(core.runner, PROMPTS)
    hf = load_hf(path)
    _dequantized_in_place(hf, quantization)
    for prompt, logits in zip(PROMPTS, ours):
        ref = hf_logits(hf, prompt)[-1]
        assert np.abs(logits - ref).max() < 1e-3
        assert logits.argmax() == ref.argmax()


def test_expert_layers_and_routing_read_as_transformers_does():
    """Sparse and dense layers (Qwen's decoder_sparse_step and mlp_only_layers) as
    transformers builds them, and each family's experts a token and renormalization."""
    import transformers

    from wick.compiler.hf_source import raw_config
    from wick.compiler.models import granitemoe, mixtral, olmoe, qwen2_moe, qwen3_moe

    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                 num_key_value_heads=1)
    cfg = transformers.Qwen2MoeConfig(**small, num_hidden_layers=5, decoder_sparse_step=2,
                                      mlp_only_layers=[3], num_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=32,
                                      shared_expert_intermediate_size=48)
    model = transformers.Qwen2MoeForCausalLM(cfg)
    want = tuple(type(layer.mlp).__name__ == "Qwen2MoeSparseMoeBlock"
                 for layer in model.model.layers)
    assert want == (False, True, False, False, False)  # (layer 3 dense by mlp_only_layers)
    settings = qwen2_moe.Config.from_hf(raw_config(cfg.to_dict())).extra["moe"]
    assert settings.sparse_layers == want
    assert (settings.num_experts, settings.top_k, settings.expert_size,
            settings.shared_expert_size, settings.normalize) == (4, 2, 32, 48, False)
    # each family's transformers defaults (a config naming only its sizes)
    for family, config_class, expert_size in (
            (qwen3_moe, transformers.Qwen3MoeConfig, "moe_intermediate_size"),
            (mixtral, transformers.MixtralConfig, "intermediate_size"),
            (olmoe, transformers.OlmoeConfig, "intermediate_size"),
            (granitemoe, transformers.GraniteMoeConfig, "intermediate_size")):
        hf = raw_config(config_class(**small, num_hidden_layers=2).to_dict())
        s = family.Config.from_hf(hf).extra["moe"]
        experts = hf.get("num_experts") or hf.get("num_local_experts")
        assert (s.num_experts, s.top_k, s.expert_size) == (
            experts, hf["num_experts_per_tok"], hf[expert_size]), family.NAME
        # Mixtral and Granite MoE always renormalize (a softmax over the chosen ones)
        assert s.normalize == (family in (mixtral, granitemoe)
                               or bool(hf.get("norm_topk_prob"))), family.NAME
        assert s.sparse_layers == (True, True)
    # a config silent on the experts' widths: transformers' defaults
    for family, config_class in ((qwen3_moe, transformers.Qwen3MoeConfig),
                                 (qwen2_moe, transformers.Qwen2MoeConfig)):
        hf = raw_config(config_class(**small, num_hidden_layers=2).to_dict())
        silent = {k: v for k, v in hf.items()
                  if k not in ("moe_intermediate_size", "shared_expert_intermediate_size")}
        s = family.Config.from_hf(silent).extra["moe"]
        default = config_class()
        assert s.expert_size == default.moe_intermediate_size, family.NAME
        assert s.shared_expert_size == getattr(default, "shared_expert_intermediate_size", 0)


def test_ernie_experts_chosen_by_probability_plus_bias_on_the_cpu(tmp_path_factory, compiled):
    """ERNIE 4.5 MoE on the CPU kernel set (the rank kernel reading probabilities + the
    correction bias): transformers' logits; and the bias matters (without it, transformers'
    logits are other ones)."""
    import torch

    from wick.native.cpu_backend import CpuBackend

    path = family_model(tmp_path_factory.mktemp("tiny-ernie-moe-cpu"), "ernie4_5_moe")
    art_dir = compiled(path, "q0f32", kernel_sets=("cpu",), **TINY_OPTIONS)
    ours = prefill_logits(make_core(art_dir, CpuBackend.create()).runner, PROMPTS)
    hf = load_hf(path)
    refs = [hf_logits(hf, prompt)[-1] for prompt in PROMPTS]
    for logits, ref in zip(ours, refs):
        assert np.abs(logits - ref).max() < 1e-3 and logits.argmax() == ref.argmax()
    with torch.no_grad():
        for layer in hf.model.layers[1:]:
            layer.mlp.gate.moe_statics.e_score_correction_bias.zero_()
    unbiased = [hf_logits(hf, prompt)[-1] for prompt in PROMPTS]
    assert max(np.abs(logits - ref).max() for logits, ref in zip(ours, unbiased)) > 1e-2


def test_ernie_expert_layers_read_as_transformers_does():
    import transformers

    from wick.compiler.hf_source import raw_config
    from wick.compiler.models import ernie4_5_moe

    cfg = transformers.Ernie4_5_MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, num_hidden_layers=7, moe_layer_start_index=2,
        moe_layer_end_index=5, moe_layer_interval=2, moe_num_experts=4, moe_k=2,
        moe_intermediate_size=16, moe_num_shared_experts=2)
    model = transformers.Ernie4_5_MoeForCausalLM(cfg)
    want = tuple(type(layer.mlp).__name__ == "Ernie4_5_MoeSparseMoeBlock"
                 for layer in model.model.layers)
    assert want == (False, False, False, True, False, True, False)
    s = ernie4_5_moe.Config.from_hf(raw_config(cfg.to_dict())).extra["moe"]
    assert s.sparse_layers == want
    assert (s.num_experts, s.top_k, s.expert_size, s.shared_expert_size, s.normalize,
            s.shared_gated, s.selection_bias) == (4, 2, 16, 32, True, False, True)


def _mxfp4_checkpoint(path, seed: int = 0):
    """The tiny GPT-OSS at ``path`` with its experts rewritten as OpenAI's checkpoints store
    them: random MXFP4 blocks and scales (``*_blocks``, ``*_scales``) in place of the float
    stacks; returns transformers' model with the stacks transformers' own MXFP4 reader
    (``convert_moe_packed_tensors``) makes of them."""
    import torch
    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(seed)
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    hf = load_hf(path)
    for i, layer in enumerate(hf.model.layers):
        for name in ("gate_up_proj", "down_proj"):
            stack = tensors.pop(f"model.layers.{i}.mlp.experts.{name}")  # (E, in, out)
            experts, rows, cols = stack.shape[0], stack.shape[2], stack.shape[1]
            blocks = rng.integers(0, 256, (experts, rows, cols // 32, 16), dtype=np.uint8)
            scales = rng.integers(122, 126, (experts, rows, cols // 32), dtype=np.uint8)
            tensors[f"model.layers.{i}.mlp.experts.{name}_blocks"] = blocks
            tensors[f"model.layers.{i}.mlp.experts.{name}_scales"] = scales
            floats = convert_moe_packed_tensors(torch.from_numpy(blocks),
                                                torch.from_numpy(scales), dtype=torch.float32)
            with torch.no_grad():
                getattr(layer.mlp.experts, name).copy_(floats)
    save_file(tensors, str(file))
    return hf


def test_gpt_oss_from_mxfp4_experts_with_sinks_on_the_cpu(tmp_path_factory, compiled):
    """GPT-OSS as OpenAI ships it (experts in MXFP4) on the CPU kernel set: its window
    kernel with attention sinks, the router's and experts' biases, the clamped gate; the
    logits equal transformers' on the floats transformers reads from the same MXFP4 bytes.
    And the sinks matter (without them transformers gives other logits)."""
    import torch

    from wick.compiler.models.gpt_oss import mxfp4_floats
    from wick.native.cpu_backend import CpuBackend

    # (the reader itself: the same floats as transformers', codes and exponents of every kind)
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, (2, 3, 4, 16), dtype=np.uint8)
    scales = rng.integers(100, 150, (2, 3, 4), dtype=np.uint8)
    theirs = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                        dtype=torch.float32).numpy()
    assert np.array_equal(mxfp4_floats(blocks, scales), theirs.transpose(0, 2, 1))

    path = family_model(tmp_path_factory.mktemp("tiny-gpt-oss-mxfp4"), "gpt_oss")
    hf = _mxfp4_checkpoint(path)
    art_dir = compiled(path, "q0f32", kernel_sets=("cpu",), **TINY_OPTIONS)
    prompts = PROMPTS + [list(range(60, 100))]  # (40 tokens: past the window of 20)
    ours = prefill_logits(make_core(art_dir, CpuBackend.create()).runner, prompts)
    refs = [hf_logits(hf, prompt)[-1] for prompt in prompts]
    for logits, ref in zip(ours, refs):
        assert np.abs(logits - ref).max() < 1e-3 and logits.argmax() == ref.argmax()
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
    unsunk = [hf_logits(hf, prompt)[-1] for prompt in prompts]
    assert max(np.abs(logits - ref).max() for logits, ref in zip(ours, unsunk)) > 1e-2
