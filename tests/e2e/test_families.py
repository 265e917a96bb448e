"""Every model family on a random tiny model built from its transformers config: compiled to
q0f32 and run on the real backend, against transformers on the same HF directory (Qwen2 in
bf16 and the Llama 3 GGUF fetched as hf:// repos from the stand-in Hub, tests/hub_standin.py).

Llama has its own, longer suite (test_tiny_parity.py); here each other family gets prefill
logits, 32 greedy tokens, a prompt over several pages, a batch, and an f16 variant."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.e2e.conftest import TINY_OPTIONS, WEBGPU_ONLY
from tests.e2e.family_models import (
    EVERY_LAYER_WINDOWED,
    FAMILIES,
    GGUF_CASES,
    HUB_REPOS,
    WINDOWED_BESIDE_GLOBAL,
    family_model,
    gguf_arch,
    family_of,
    gguf_case,
)
from tests.e2e.helpers import (
    ids_of,
    greedy,
    hf_greedy,
    hf_greedy_stepwise,
    hf_logits,
    load_artifact,
    load_hf,
    make_core,
    prefill_logits,
    run_core,
)

LOGIT_TOL = 1e-3
F16_LOGIT_TOL = 0.1  # f16 weights and activations, f32 accumulation: logits of size ~5-20

def reference_greedy(name: str):
    """transformers' greedy tokens for a family: ``generate``, except for the longrope model
    whose generations cross its pretrained length (helpers.hf_greedy_stepwise says why)."""
    return hf_greedy_stepwise if name == "phi3" else hf_greedy


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory, compiled, backend):
    """(name, core, hf, artifact dir) of one family's tiny model; Qwen2's (bf16) fetched as
    hf://org/tiny-qwen2 from the stand-in Hub."""
    name = request.param
    if name in HUB_REPOS:
        path = request.getfixturevalue("hub_models").dirs[name]
        art_dir = request.getfixturevalue("compiled_from_hub")(name)
    else:
        path = family_model(tmp_path_factory.mktemp(f"tiny-{name}"), name)
        art_dir = compiled(path, "q0f32", kernel_sets=("webgpu", "cuda"), **TINY_OPTIONS)
    return name, make_core(art_dir, num_pages=64), load_hf(path), art_dir, path


def test_manifest_names_the_family(family):
    name, core, _, art_dir, path = family
    art = load_artifact(art_dir)
    assert art.model["family"] == core.info.family == family_of(name)
    names = {p.name for p in art.params}
    if name == "opt":  # its tokenizer came as vocab.json + merges.txt: the same ids
        from tests.tiny_models import byte_level_tokenizer

        assert not (path / "tokenizer.json").exists()
        text = "<|im_start|>user\nthe  cat<|im_end|>"
        assert core.tokenizer.encode(text) == byte_level_tokenizer().encode(text).ids
    if name == "qwen2":
        assert sum(n.endswith("qkv_proj.bias") for n in names) == 2
        assert not any(n.endswith("o_proj.bias") for n in names)
    if name == "qwen3":
        assert sum(n.endswith("self_attn.q_norm.weight") for n in names) == 2


def test_cuda_kernels_compile_with_nvrtc(family):
    """Every family's kernels (windowed and soft-capped attention, q/k norms, longrope...)
    lowered for CUDA: NVRTC compiles them for an H100, one entry per kernel named."""
    from tests.native.test_cuda_backend import kernel_signatures
    from wick.native import nvrtc

    _, _, _, art_dir, _ = family
    entry = load_artifact(art_dir).kernel_set("cuda")
    source = (art_dir / entry["file"]).read_text()
    assert {k["name"] for k in entry["kernels"]} == set(kernel_signatures(source))
    assert nvrtc.compile_cuda(source, "sm_90")[:4] == b"\x7fELF"


def test_prefill_logits_match_transformers(family):
    name, core, hf, _, _ = family
    prompts = [ids_of(23, 1), ids_of(5, 2), ids_of(40, 3)]  # 40 tokens: three pages
    batch = prefill_logits(core.runner, prompts)
    for i, p in enumerate(prompts):
        ref = hf_logits(hf, p)[-1]
        diff = np.abs(batch[i] - ref).max()
        print(f"{name}: prefill logits of {len(p)} tokens: max|wick - hf| = {diff:.2e}")
        assert diff < LOGIT_TOL
        assert int(np.argmax(batch[i])) == int(np.argmax(ref))


def test_greedy_32_tokens_match_transformers(family):
    name, core, hf, _, _ = family
    prompt = ids_of(50, 4)  # four pages before the first new token
    (got,) = run_core(core, [prompt], greedy(32))
    want = reference_greedy(name)(hf, prompt, 32)
    assert got == want
    assert len(set(want)) >= 4  # a real continuation, not one token repeated
    if name == "phi3":  # the long factors are used from position 64 on, and they matter
        assert want != hf_greedy_stepwise(_with_rope_factors(hf, "short"), prompt, 32)


def _with_rope_factors(hf, which: str):
    """A copy of a longrope model that uses ``which`` factors at every position."""
    import copy

    other = copy.deepcopy(hf)
    rope = other.model.rotary_emb
    other.config.rope_parameters["long_factor"] = list(
        other.config.rope_parameters[f"{which}_factor"])
    rope.long_inv_freq = rope.original_inv_freq.clone()
    return other


def test_batched_sequences_match_transformers(family):
    name, core, hf, _, _ = family
    prompts = [ids_of(n, 30 + n) for n in (3, 17, 33)]
    together = run_core(core, prompts, greedy(12))
    for p, got in zip(prompts, together):
        assert got == reference_greedy(name)(hf, p, 12)
    assert core.kv.available_pages == core.kv.num_pages


def test_f16_variant_within_f16_tolerance(family, compiled, backend):
    if "shader-f16" not in backend.features:
        pytest.skip("this adapter has no shader-f16")
    from wick.compiler.compile import default_quantization

    name, _, hf, _, path = family
    assert default_quantization(str(path)) == ("q4f32_1" if name.startswith("gemma")
                                               else "q4f16_1")
    if name.startswith("gemma"):  # refused: real Gemma activations outgrow float16
        from wick.compiler.models.decoder import UnsupportedConfig

        with pytest.raises(UnsupportedConfig, match="q4f32_1"):
            compiled(path, "q0f16", kernel_sets=WEBGPU_ONLY, **TINY_OPTIONS)
        return
    core16 = make_core(compiled(path, "q0f16", kernel_sets=WEBGPU_ONLY, **TINY_OPTIONS),
                       num_pages=16)
    prompt = ids_of(33, 5)
    (got,) = prefill_logits(core16.runner, [prompt])
    ref = hf_logits(hf, prompt)[-1]
    diff = np.abs(got - ref).max()
    print(f"{name}: q0f16 prefill logits: max|wick - hf| = {diff:.2e}")
    assert diff < F16_LOGIT_TOL


def test_qwen3_reasoning_is_split_from_content(tmp_path_factory, compiled):
    """A tiny Qwen3 with <think> tokens and a Qwen3-like template, its output shaped by a
    grammar into think block + answer: reasoning_content and content apart, streamed too."""
    from tests.engine.test_reasoning import QWEN3_LIKE
    from tests.tiny_models import make_tiny_model
    from wick.engine.api import EngineAPI

    path = make_tiny_model(tmp_path_factory.mktemp("tiny-qwen3-think"), "qwen3", seed=3,
                           extra_tokens=["<think>", "</think>"], chat_template=QWEN3_LIKE)
    core = make_core(compiled(path, "q0f32", kernel_sets=WEBGPU_ONLY, **TINY_OPTIONS),
                     num_pages=32)
    api = EngineAPI(core)
    shape = {"type": "grammar", "grammar":
             'root ::= "<think>" [a-z] [a-z] [a-z] "</think>\\n\\n" [a-z] [a-z] [a-z] [a-z]'}
    ask = [{"role": "user", "content": "hi"}]
    r = api.chat.completions.create(messages=ask, temperature=0, max_tokens=40,
                                    response_format=shape)
    message = r.choices[0].message
    assert len(message.reasoning_content) == 3 and message.reasoning_content.isalpha()
    assert len(message.content) == 4 and message.content.isalpha()
    reasoning = content = ""
    for chunk in api.chat.completions.create(messages=ask, temperature=0, max_tokens=40,
                                             response_format=shape, stream=True):
        for c in chunk.choices:
            reasoning += c.delta.reasoning_content or ""
            content += c.delta.content or ""
    assert (reasoning, content) == (message.reasoning_content, message.content)
    # thinking off: the template writes the empty block into the prompt; no split needed
    off = api.tokenize({"messages": ask, "chat_template_kwargs": {"enable_thinking": False}})
    on = api.tokenize({"messages": ask})
    assert off["count"] > on["count"]
    assert core.tokenizer.decode(off["tokens"][on["count"]:]) == "<think>\n\n</think>\n\n"


@pytest.mark.parametrize("family", sorted(EVERY_LAYER_WINDOWED + WINDOWED_BESIDE_GLOBAL),
                         indirect=True)
def test_the_window_matters_in_these_comparisons(family):
    """The windowed families' prompts are long enough that ignoring the window would give
    other logits (so the parity tests above prove the window, not just causal attention)."""
    import copy

    name, _, hf, _, _ = family
    window = getattr(hf.config, "sliding_window", None)
    assert window, f"{name}'s tiny model has no window"
    prompt = ids_of(40, 3)
    assert len(prompt) > window
    unwindowed = copy.deepcopy(hf)  # a window longer than the prompt: full attention
    unwindowed.config.sliding_window = 10**6
    for layer in unwindowed.model.layers:
        if getattr(layer.self_attn, "sliding_window", None):
            layer.self_attn.sliding_window = 10**6
    diff = np.abs(hf_logits(unwindowed, prompt)[-1] - hf_logits(hf, prompt)[-1]).max()
    assert diff > 1e-2


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
], ids=["linear", "yarn"])
def test_rope_scaling_matches_transformers(scaling, tmp_path_factory, compiled):
    """``rope_type: linear`` (positions divided by the factor) and ``yarn`` (frequencies
    blended on a ramp, cos/sin scaled): the logits of a 40-token prompt equal transformers',
    and differ from those without the scaling."""
    from tests.tiny_models import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp(f"tiny-{scaling['rope_type']}-rope"),
                           "llama", seed=5, rope_scaling=scaling)
    core = make_core(compiled(path, "q0f32", kernel_sets=WEBGPU_ONLY, **TINY_OPTIONS),
                     num_pages=16)
    hf = load_hf(path)
    prompt = ids_of(40, 6)
    (logits,) = prefill_logits(core.runner, [prompt])
    want = hf_logits(hf, prompt)[-1]
    assert np.abs(logits - want).max() < LOGIT_TOL
    unscaled = load_hf(make_tiny_model(tmp_path_factory.mktemp("tiny-no-scaling"), "llama",
                                       seed=5))
    assert np.abs(hf_logits(unscaled, prompt)[-1] - want).max() > 1e-2


@pytest.mark.parametrize("arch", sorted(GGUF_CASES))
def test_gguf_architecture_matches_transformers(arch, request, tmp_path_factory, compiled):
    """A tiny model of each GGUF architecture written the way llama.cpp's converter writes
    it (tests/tiny_models.write_gguf): wick's GGUF path reads it back into the same model,
    logits and greedy tokens equal to transformers on the HF directory. (Llama 3's is fetched
    from a repo of the stand-in Hub, hf://org/tiny-llama-GGUF.)"""
    from wick.compiler.models import GGUF_ARCHITECTURES

    name = GGUF_CASES[arch][0]
    # (OLMo 3's file: olmo2's; a llama file with experts: Mixtral's)
    family_name = GGUF_ARCHITECTURES[gguf_arch(arch)].NAME if "+" not in arch or \
        arch == "olmo2+olmo3" else family_of(name)
    if f"gguf:{arch}" in HUB_REPOS:  # (Llama 3's: a GGUF in a repo of the stand-in Hub)
        hf_dir = request.getfixturevalue("hub_models").dirs[f"gguf:{arch}"]
        art_dir = request.getfixturevalue("compiled_from_hub")(f"gguf:{arch}")
    else:
        hf_dir, gguf_file = gguf_case(tmp_path_factory.mktemp(f"tiny-{arch}-gguf"), arch)
        art_dir = compiled(gguf_file, "q0f32", kernel_sets=WEBGPU_ONLY, **TINY_OPTIONS)
    assert load_artifact(art_dir).model["family"] == family_name
    core = make_core(art_dir, num_pages=32)
    hf = load_hf(hf_dir)
    prompt = ids_of(40, 9)
    (logits,) = prefill_logits(core.runner, [prompt])
    assert np.abs(logits - hf_logits(hf, prompt)[-1]).max() < LOGIT_TOL
    (got,) = run_core(core, [prompt], greedy(16))
    assert got == reference_greedy(name)(hf, prompt, 16)


# tensors llama.cpp's converters write beside the checkpoint's own (RoPE factor tables) or
# that gguf-py maps under another name (StableLM's per-head norms, stacked into one a layer)
CONVERTER_EXTRAS = re.compile(r"rope_freqs\.weight|rope_factors_(long|short)\.weight|"
                              r"blk\.\d+\.attn_[qk]_norm\.weight")


# llama.cpp's GPT-OSS expert tensors and the checkpoint tensor each is made of (gate|up's
# interleaved outputs split in two)
GPT_OSS_EXPERT_TENSORS = [
    ("ffn_gate_exps", "weight", "experts.gate_up_proj"),
    ("ffn_up_exps", "weight", "experts.gate_up_proj"),
    ("ffn_gate_exps", "bias", "experts.gate_up_proj_bias"),
    ("ffn_up_exps", "bias", "experts.gate_up_proj_bias"),
    ("ffn_down_exps", "weight", "experts.down_proj"),
    ("ffn_down_exps", "bias", "experts.down_proj_bias")]


def test_gguf_files_name_their_tensors_as_gguf_py_does(tmp_path):
    """The tiny GGUF writer's tensor names are gguf-py's own for each architecture (its
    TensorNameMap: what llama.cpp's converter writes), so that the GGUF tests above read the
    names real files have."""
    import gguf
    from safetensors import safe_open

    arch_of = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
    for case in sorted(GGUF_CASES):
        if case.endswith("_legacy"):  # (names gguf-py no longer has: one tensor an expert)
            continue
        hf_dir, file = gguf_case(tmp_path / case, case)
        written = {t.name for t in gguf.GGUFReader(str(file)).tensors}
        config = json.loads((hf_dir / "config.json").read_text())
        layers = config.get("num_hidden_layers") or config.get("n_layer")
        names = gguf.get_tensor_name_map(arch_of[gguf_arch(case)], layers)
        with safe_open(str(hf_dir / "model.safetensors"), "np") as f:
            # (a layer's experts: one stacked tensor a projection, named without the expert;
            # Granite MoE's gate|up stack: two, split by GraniteMoeModel.modify_tensors)
            # (ERNIE's correction bias renamed first, as ModelBase.filter_tensors does)
            expected = {names.get_name(re.sub(r"\.experts\.\d+\.", ".experts.", n).replace(
                "e_score_correction_bias", "e_score_correction.bias"),
                try_suffixes=(".weight", ".bias")) for n in f.keys()}
            expected |= {f"blk.{n.split('.')[2]}.{stack}.weight" for n in f.keys()
                         if n.endswith("block_sparse_moe.input_linear.weight")
                         for stack in ("ffn_gate_exps", "ffn_up_exps")}
            if case == "gpt-oss":  # GptOssModel.modify_tensors: what it names by hand
                expected -= {names.get_name(n) for n in f.keys()}  # (no suffixes: below)
                expected |= {names.get_name(n + ".weight", try_suffixes=(".weight",))
                             for n in f.keys()
                             if n.endswith(".sinks")}  # (written as a weight)
                expected |= {f"blk.{n.split('.')[2]}.{stack}.{kind}" for n in f.keys()
                             for stack, kind, source in GPT_OSS_EXPERT_TENSORS
                             if n.endswith(source)}
        expected.discard(None)
        assert {n for n in written if not CONVERTER_EXTRAS.fullmatch(n)} == {
            n for n in expected if not CONVERTER_EXTRAS.fullmatch(n)}, case


@pytest.mark.parametrize("family", sorted(EVERY_LAYER_WINDOWED), indirect=True)
def test_a_windowed_model_runs_past_its_kv_pool(family):
    """Every layer windowed (Mistral, Phi-3): the cache frees pages behind the window, so a
    sequence longer than the whole pool runs, and gives transformers' tokens."""
    name, _, hf, art_dir, _ = family
    assert load_artifact(art_dir).model.get("kv_window"), f"{name}: not every layer is windowed"
    # 5 pages (80 token slots); steps of at most 16 tokens: 24-token window + 16 + alignment
    core = make_core(art_dir, num_pages=5, prefill_chunk_size=16)
    prompt = ids_of(50, 12)
    (got,) = run_core(core, [prompt], greedy(50))
    assert len(prompt) + len(got) > core.kv.capacity_tokens
    assert got == reference_greedy(name)(hf, prompt, 50)
    assert core.kv.available_pages == core.kv.num_pages


@pytest.mark.parametrize("family", sorted(WINDOWED_BESIDE_GLOBAL), indirect=True)
def test_global_and_windowed_layers_have_a_pool_each(family):
    """Gemma: windowed layers keep their KV in a pool of their own whose pages slide with the
    window; a long generation gives transformers' tokens and leaves both pools whole."""
    name, _, hf, art_dir, _ = family
    assert load_artifact(art_dir).model.get("kv_window_pool"), f"{name}: no pool of its own"
    core = make_core(art_dir, num_pages=16, prefill_chunk_size=16)
    local = core.kv.local
    held = []
    real_allocate = local.allocate

    def watch(seq_id, num_tokens, *hit):
        real_allocate(seq_id, num_tokens, *hit)
        held.append(len(local.page_table(seq_id)))

    local.allocate = watch
    prompt = ids_of(50, 13)
    (got,) = run_core(core, [prompt], greedy(40))
    assert got == reference_greedy(name)(hf, prompt, 40)
    window = load_artifact(art_dir).model["kv_window_pool"]
    assert max(held) <= -(-(window + 16) // 16) + 1 < -(-(50 + 40) // 16)  # it slid
    assert core.kv.main.available_pages == core.kv.main.num_pages
    assert local.available_pages == local.num_pages


def test_speculation_keeps_transformers_greedy_tokens(family):
    """Verify steps on every family (windowed layers included, past the window): drafts from
    a prediction that is right but for two tokens, and n-gram drafts beside it, leave the
    greedy tokens transformers' while most drafts are kept and the wrong ones cut off."""
    from wick.engine.speculative import SpeculativeConfig

    name, _, hf, art_dir, _ = family
    want = reference_greedy(name)(hf, ids_of(50, 14), 40)
    prediction = list(want)
    prediction[9] = (prediction[9] + 1) % 256  # two tokens the model will not write
    prediction[25] = (prediction[25] + 7) % 256
    from wick.engine.draft_length import StepCost

    core = make_core(art_dir, num_pages=16, prefill_chunk_size=16,
                     speculative=SpeculativeConfig("ngram", 6))
    core.step_cost = StepCost(prior=0.2, learn=False)  # (draft lengths not the load's)
    core.add_request(ids_of(50, 14), greedy(40), prompt_param="prompt", prediction=prediction)
    got = []
    while core.has_unfinished():
        for o in core.step():
            got.extend(o.token_ids)
    assert got == want
    s = core.stats
    assert s.spec_accepted_tokens >= 20 and s.spec_drafted_tokens > s.spec_accepted_tokens
    assert core.kv.available_pages == core.kv.num_pages


def test_every_family_has_a_tiny_model_and_each_gguf_architecture_a_file():
    """A family added without a model here would go untested against transformers."""
    from wick.compiler.models import FAMILIES as COMPILED, GGUF_ARCHITECTURES

    decoders = {name for name in COMPILED if name != "bert"}  # (BERT: test_embeddings.py)
    assert decoders == {family_of(name) for name in FAMILIES}
    # (Gemma 3's: the real Gemma-3-270m GGUF, test_gemma3_270m.py)
    assert set(GGUF_ARCHITECTURES) - {gguf_arch(case) for case in GGUF_CASES} == {"gemma3"}
