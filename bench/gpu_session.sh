#!/usr/bin/env bash
# Issue #26's device check as one call of the device tool (15 minutes of device time in all):
# parity, the 8B-shape table with the PyTorch peer, and a kernel-time breakdown of a batch-1
# decode step on CUDA. Each stage has its own time limit, so one that fails or hangs leaves the
# others their time; everything is written under $OUT (at most 8 files come back).
#
#   (here)   bash bench/gpu_carry.sh [&& bash bench/gpu_carry.sh embed] && git commit ...
#   (device) WICK_COMMIT=<sha> bash bench/gpu_session.sh [stage ...]
#            # carry: build/gpu/wheels build/gpu/gl build/gpu/pack.tar.xz (unpacked here first)
#
# Stages (default: all, in this order): env parity q4 vulkan profile q0 (vulkan: the q4
# artifact on Vulkan with the WebGPU set's decode GEMVs as dlight made them before
# compiler/batched_gemv.py, beside q4's own Vulkan rows, issue #28). Not by default: ncu (Nsight
# Compute's counters for the decode step's attention and batched GEMV, where a kernel's time
# alone does not say why it is slow), gemv (bench/gpu_gemv.py: the batched GEMV's schedules side
# by side), embed (bench/gpu_embed.py: all-MiniLM-L6-v2 on CUDA, issue #29).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/wick-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
log="$out/session.log"
if [ -f build/gpu/pack.tar.xz ]; then  # (bench/gpu_carry.sh packs the artifacts: unpack once)
  sum=$(cksum < build/gpu/pack.tar.xz)  # (a warm machine keeps the last unpacked one)
  [ "$(cat build/gpu/.unpacked 2>/dev/null)" = "$sum" ] || { python3 -c 'import sys, tarfile
tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' build/gpu/pack.tar.xz build/gpu &&
    echo "$sum" > build/gpu/.unpacked; }
fi
stages=${*:-env parity q4 vulkan profile q0}

stage() {  # NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "=== $name: start $(date +%T), limit ${limit}s" | tee -a "$log"
  timeout "$limit" "$@" >>"$log" 2>&1
  echo "=== $name: exit $? at $(date +%T)" | tee -a "$log"
}

for s in $stages; do
  case $s in
    env) stage env 60 bash -c 'nvidia-smi; python3 --version;
      python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())";
      ls /usr/local/nvidia/share/vulkan/icd.d /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>&1; true' ;;
    parity) stage parity "${T_PARITY:-60}" bash bench/gpu_device.sh parity ;;
    q4) stage q4 "${T_Q4:-180}" bash bench/gpu_device.sh bench --quant q4f16_1 \
          --json "$out/gpu-llama-3-8b-q4f16_1.json" ;;
    vulkan) stage vulkan "${T_VULKAN:-60}" bash bench/gpu_device.sh bench --quant q4f16_1 \
          --backends vulkan --peer none --artifacts build/gpu/dlight-gemv \
          --json "$out/gpu-vulkan-dlight-gemv.json" ;;
    profile) for b in 1 8; do
          stage "profile-b$b" "${T_PROFILE:-30}" bash bench/gpu_device.sh profile \
            build/gpu/llama-3-8b-q4f16_1 --batch "$b" --json "$out/gpu-profile-q4f16_1-b$b.json"
        done ;;
    q0) stage q0 "${T_Q0:-150}" bash bench/gpu_device.sh bench --quant q0f16 \
          --json "$out/gpu-llama-3-8b-q0f16.json" ;;
    ncu) stage ncu "${T_NCU:-120}" bash bench/gpu_device.sh ncu \
          "^decode_(batch_prefill_paged_kv|dequantize_matmul2)_kernel$" \
          build/gpu/llama-3-8b-q4f16_1 \
          --batch 8 ;;
    gemv) stage gemv "${T_GEMV:-150}" bash bench/gpu_device.sh gemv \
          ${GEMV_SCHEDULES:+--schedules $GEMV_SCHEDULES} --json "$out/gpu-gemv.json" ;;
    embed) stage embed "${T_EMBED:-150}" bash bench/gpu_device.sh embed \
          --json "$out/gpu-embed.json" ;;  # (not by default; carry build/gpu/{embed,wheels,gl})
    *) echo "unknown stage $s" | tee -a "$log" ;;
  esac
done
tail -c 11000 "$log"
