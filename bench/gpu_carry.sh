#!/usr/bin/env bash
# Prepare build/gpu/ for bench/gpu.py on a GPU machine that reaches no package registry
# (FIELD_NOTES "The GPU test machine"): the synthetic artifacts (compiled here, where TVM is),
# the wheels wick's runtime needs beyond what that machine has (it has numpy, torch and CUDA),
# and Debian's Vulkan loader. Everything stays under the 64 MiB a run may carry.
#
#   bash bench/gpu_carry.sh [CONFIG] [PYTHON_VERSION]    # defaults: Llama-3-8B shapes, 3.12
#
# then, on the GPU machine (the `run` tool, carrying build/gpu):
#   bash bench/gpu_device.sh parity                  # CUDA and Vulkan against lavapipe's outputs
#   bash bench/gpu_device.sh bench [bench/gpu.py options]
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-bench/configs/llama-3-8b.json}
pyver=${2:-3.12}
out=${WICK_GPU_CARRY:-build/gpu}
py=.venv/bin/python

"$py" bench/gpu.py --config "$config" --compile-only --artifacts "$out"
# the parity references: tiny and SmolLM2-shaped artifacts, their outputs on lavapipe
"$py" bench/gpu_parity.py record --artifacts "$out/parity"

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
du -sh "$out"
