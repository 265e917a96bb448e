#!/usr/bin/env bash
# Prepare build/gpu/ for bench/gpu.py on a GPU machine that reaches no package registry (the
# lent H100/H200): the synthetic artifacts (compiled here, where TVM is), the wheels wick's
# runtime needs beyond what that machine has (it has numpy, torch and CUDA), and Debian's
# Vulkan loader. Everything stays under the 64 MiB a run may carry.
#
#   bash bench/gpu_carry.sh [CONFIG] [PYTHON_VERSION]    # defaults: Llama-3-8B shapes, 3.12
#
# then, on the GPU machine (the `run` tool, carrying build/gpu):
#   bash bench/gpu_device.sh parity                  # CUDA and Vulkan against lavapipe's outputs
#   bash bench/gpu_device.sh bench [bench/gpu.py options]
#
#   bash bench/gpu_carry.sh embed     # issue #29's part alone: build/gpu/embed (~30 MiB, by
#                                     # bench/gpu_embed.py record), for `gpu_session.sh embed`
# Either way the script ends by packing what it built beside the wheels and debs (artifacts,
# references, kernel sources: mostly text, ~10x smaller in xz) into build/gpu/pack.tar.xz, which
# bench/gpu_session.sh unpacks on the GPU machine: a run carries build/gpu/wheels,
# build/gpu/gl and build/gpu/pack.tar.xz (~50 MiB with the embeddings part, under the 64).
set -euo pipefail
cd "$(dirname "$0")/.."

pack() {  # everything in build/gpu but the wheels and debs, as one xz tarball
  local out=$1
  (cd "$out" && ls | grep -v -x -e wheels -e gl -e pack.tar.xz |
    tar cf - -T - | xz -T0 -6 > pack.tar.xz)
  du -sh "$out/pack.tar.xz" "$out/wheels" "$out/gl" 2>/dev/null || true
}
if [ "${1:-}" = embed ]; then  # (rebuilt every time: the kernels of this checkout's compiler)
  out=${WICK_GPU_CARRY:-build/gpu}
  rm -rf "$out/embed"
  .venv/bin/python bench/gpu_embed.py record --out "$out/embed"
  [ -d "$out/wheels" ] && [ -d "$out/gl" ] ||
    echo "note: build/gpu/wheels and gl are missing: run bash bench/gpu_carry.sh once" >&2
  du -sh "$out/embed"
  pack "$out"
  exit 0
fi
config=${1:-bench/configs/llama-3-8b.json}
pyver=${2:-3.12}
out=${WICK_GPU_CARRY:-build/gpu}
py=.venv/bin/python

"$py" bench/gpu.py --config "$config" --compile-only --artifacts "$out"
# the q4 artifact with the WebGPU set's decode GEMVs as before compiler/batched_gemv.py took them
# (dlight's LowBatchGEMV): gpu_session.sh's vulkan stage measures both in one run
"$py" bench/gpu.py --config "$config" --quant q4f16_1 --compile-only --webgpu-gemv dlight \
  --artifacts "$out/dlight-gemv"
# the parity references: tiny and SmolLM2-shaped artifacts, their outputs on lavapipe
"$py" bench/gpu_parity.py record --artifacts "$out/parity"
# the decode GEMV's CUDA schedules, side by side (bench/gpu_gemv.py)
"$py" bench/gpu_gemv.py build --config "$config" --out "$out/gemv"

# the versions this checkout runs with (wgpu and xgrammar are pinned in pyproject/setup.sh)
pins=$("$py" - <<'PY'
from importlib.metadata import version
names = ["tokenizers", "xgrammar", "wgpu", "jinja2", "markupsafe", "cffi", "pycparser",
         "rendercanvas"]
print(" ".join(f"{n}=={version(n)}" for n in names))
PY
)
rm -rf "$out/wheels" && mkdir -p "$out/wheels"
# shellcheck disable=SC2086
"$py" -m pip download -q --only-binary=:all: --no-deps --python-version "$pyver" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 -d "$out/wheels" $pins
# the Vulkan loader, and the GL dispatch libraries NVIDIA's Vulkan driver library links against
# (the device tool's notes: unpacked into / on the GPU machine, which has none of them)
rm -rf "$out"/libvulkan1_*.deb "$out/gl" && mkdir -p "$out/gl"
(cd "$out/gl" && apt-get download -q libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 \
  libgles2 >/dev/null) || { echo "error: apt-get download of the Vulkan/GL debs failed" >&2; exit 1; }
pack "$out"
