#!/usr/bin/env bash
# Run bench/gpu.py on the GPU machine with what bench/gpu_carry.sh put in build/gpu/: the
# carried wheels installed into a scratch directory (no registry there), the Vulkan loader
# unpacked, NVIDIA's Vulkan driver found (or its manifest written), wick imported from this
# tree (bench/gpu.py falls back to it when wick is not installed).
#
#   bash bench/gpu_device.sh parity [bench/gpu_parity.py check options]
#   bash bench/gpu_device.sh bench [bench/gpu.py options, e.g. --quant q4f16_1 --backends cuda]
#   bash bench/gpu_device.sh profile ARTIFACT [bench/gpu_profile.py options]
#   bash bench/gpu_device.sh ncu KERNEL_REGEX ARTIFACT [bench/gpu_profile.py options]
#   bash bench/gpu_device.sh embed [bench/gpu_embed.py check options]   # build/gpu/embed
#   bash bench/gpu_device.sh gemv [bench/gpu_gemv.py run options]        # build/gpu/gemv
set -euo pipefail
cd "$(dirname "$0")/.."
carry=${WICK_GPU_CARRY:-build/gpu}
site=/tmp/wick-site
vk=/tmp/wick-vulkan
if [ ! -d "$site" ]; then
  python3 -m pip install -q --root-user-action=ignore --no-index --no-deps --target "$site" "$carry"/wheels/*.whl
fi
if [ ! -e "$vk" ]; then  # the loader and GL dispatch libraries, once per machine
  if [ "$(id -u)" = 0 ]; then
    for f in "$carry"/gl/*.deb; do [ -e "$f" ] && dpkg-deb -x "$f" /; done
    ldconfig
  else
    for f in "$carry"/gl/*.deb; do [ -e "$f" ] && dpkg-deb -x "$f" "$vk"; done
  fi
  mkdir -p "$vk"
fi
export LD_LIBRARY_PATH="$vk/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
icd=$(ls /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd*.json /usr/share/vulkan/icd.d/nvidia_icd*.json /etc/vulkan/icd.d/nvidia_icd*.json 2>/dev/null | head -1 || true)
if [ -z "$icd" ]; then  # a container without the ICD manifest: write one for the driver's library
  lib=$(ldconfig -p 2>/dev/null | grep -o '/[^ ]*libGLX_nvidia.so.0' | head -1 || true)
  if [ -n "$lib" ]; then
    icd=/tmp/wick-nvidia-icd.json
    printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.3"}}\n' "$lib" > "$icd"
  fi
fi
[ -n "$icd" ] && export VK_DRIVER_FILES="$icd"
export PYTHONPATH="$site:${PYTHONPATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
mode=${1:-bench}
shift || true
if [ "$mode" = parity ]; then
  exec python3 bench/gpu_parity.py check --artifacts "$carry/parity" "$@"
fi
if [ "$mode" = gemv ]; then  # issue #28: the batched decode GEMV's CUDA schedules
  exec python3 bench/gpu_gemv.py run --dir "$carry/gemv" "$@"
fi
if [ "$mode" = embed ]; then  # issue #29: all-MiniLM-L6-v2 on CUDA, correctness and speed
  exec python3 bench/gpu_embed.py check --artifacts "$carry/embed" "$@"
fi
if [ "$mode" = profile ]; then
  exec python3 bench/gpu_profile.py "$@"
fi
if [ "$mode" = ncu ]; then  # ncu KERNEL_REGEX ARTIFACT [gpu_profile options]: hardware counters
  regex=$1
  shift
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$ncu_bin" ] || { echo "error: Nsight Compute (ncu) is not on this machine" >&2; exit 1; }
  exec "$ncu_bin" --clock-control none --kernel-name "regex:$regex" --launch-skip 40 \
    --launch-count 3 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section LaunchStats --section Occupancy \
    python3 bench/gpu_profile.py "$@"
fi
exec python3 bench/gpu.py --artifacts "$carry" "$@"
