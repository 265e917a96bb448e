"""Mixture-of-experts on the CPU: wick vs llama.cpp on one Qwen3-MoE-shaped GGUF, bench/cpu.py's
table (prefill and decode tok/s at batch 1 and at --batch, the same threads and prompt ids).

    python bench/moe.py [--experts 32] [--top-k 4] [--hidden 1024] [--expert-size 512]
                        [--layers 8] [bench/cpu.py's options: --tokens, --batch, --threads ...]

No network here reaches a real MoE checkpoint, so the model is random (a step's speed does not
depend on the weights' values): transformers' Qwen3MoeForCausalLM of the given shape, written
as llama.cpp's converter writes ``qwen3moe`` (tests/tiny_models.write_gguf) with every linear
and expert stack in Q4_0, the routers in F32 as the converter keeps them. wick compiles it to
q4f32_1, which keeps Q4_0's blocks exactly. A decode step reads top-k of each layer's experts
in both engines (wick's gathered GEMV, llama.cpp's mul_mat_id). Needs ``llama-cpp-python``
(bench/cpu.py says how to build it for this CPU).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# llama.cpp tensor kinds written in Q4_0 (the router ffn_gate_inp and the norms stay F32)
Q4_0_KINDS = ("token_embd.weight", "output.weight", "attn_q.weight", "attn_k.weight",
              "attn_v.weight", "attn_output.weight", "ffn_gate_exps.weight",
              "ffn_up_exps.weight", "ffn_down_exps.weight")


def synthetic_moe(root: Path, experts: int, top_k: int, hidden: int, expert_size: int,
                  layers: int) -> Path:
    """The random Qwen3-MoE GGUF of this shape (written once under ``root``)."""
    from tests.tiny_models import make_tiny_model, write_gguf

    name = f"qwen3moe-e{experts}k{top_k}-h{hidden}-f{expert_size}-l{layers}"
    out = root / f"{name}.gguf"
    if out.exists():
        return out
    hf_dir = make_tiny_model(
        root / name, "qwen3_moe", layers=layers, context=4096, merges=[("\u0120", "\u0120")],
        hidden_size=hidden,
        intermediate_size=4 * hidden, num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 256), head_dim=64, num_experts=experts,
        num_experts_per_tok=top_k, moe_intermediate_size=expert_size, norm_topk_prob=True)
    return write_gguf(hf_dir, out, "qwen3moe", types={kind: "Q4_0" for kind in Q4_0_KINDS})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--expert-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dir", type=Path, default=ROOT / "build" / "bench-moe")
    args, rest = parser.parse_known_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    gguf = synthetic_moe(args.dir, args.experts, args.top_k, args.hidden, args.expert_size,
                         args.layers)
    print(f"{gguf.name}: {args.experts} experts of {args.expert_size}, {args.top_k} a token, "
          f"hidden {args.hidden}, {args.layers} layers")
    import cpu

    cpu.main(["--model", str(gguf), *rest])


if __name__ == "__main__":
    main()
