#!/usr/bin/env bash
# One device call: the kernel tests on CUDA, then the full-size benchmark.
# Usage (repo root, on the GPU machine): bash benchmarks/kernels/gpu_check.sh [OUTDIR]
#   OUTDIR defaults to $OUT (set by the device tool), else bench-output/kernels (git-ignored).
# Env: TESTS (test files), TEST_TIMEOUT, SKIP_BENCH, BENCH_TIMEOUT, BENCH_ARGS (e.g. "--only topk,ragged"),
#      HOST_BENCH=1 (also benchmarks/kernels/host.py: eager host cost at B=1, DeepGEMM if importable),
#      FP4_BENCH=1 (also benchmarks/kernels/fp4.py: fp4 decode logits beside niah fp8 / bf16 and DeepGEMM fp8),
#      TWO_STAGE_BENCH=1 (also benchmarks/kernels/two_stage.py: two-stage selection beside DeepGEMM fp8, niah bf16),
#      DEEPGEMM_CARRY=DIR (benchmarks/prepare_carry.sh's folder: DeepGEMM is built from it in the background
#        while the tests run, build_deep_gemm.sh, and importable for the benchmarks after them),
#      SGLANG_TOPK=1 (with DEEPGEMM_CARRY: SGLang's topk_v2 built from its carried source in the background too,
#        benchmarks/sglang_jit_build.py; two_stage.py then times it after DeepGEMM's logits),
#      PROFILE_TOPK="rows width k [method]", PROFILE_PAGED=fp8|bf16|fp4 or a comma list (ncu, one warm launch each; NCU_TIMEOUT)
# Works without installing the package: niah.kernels is mapped by a symlink if needed.
set -u
OUT_DIR=${1:-${OUT:-bench-output/kernels}}
mkdir -p "$OUT_DIR"
B=benchmarks/kernels
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"  # tests/: the helpers the kernel tests import (--noconftest)
if ! python3 -c "import niah.kernels" 2>/dev/null; then ln -sfn ../kernels niah/kernels; fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT_DIR/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT_DIR/gpu.txt"
TESTS=${TESTS:-tests/kernels}
DG_PID=
if [ -n "${DEEPGEMM_CARRY:-}" ]; then
  DGW=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$DGW/site" "$DEEPGEMM_CARRY"/wheels/apache_tvm_ffi-*.whl
  export PYTHONPATH="$PYTHONPATH:$DGW/site"
  if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDA_HOME=/usr/local/cuda; fi
  ( timeout "${DG_BUILD_TIMEOUT:-420}" bash benchmarks/build_deep_gemm.sh "$DEEPGEMM_CARRY" "$DGW/dg"; echo "deep_gemm build exit $?" ) \
    > "$OUT_DIR/deep_gemm_build.log" 2>&1 &
  DG_PID=$!
  if [ -n "${SGLANG_TOPK:-}" ]; then
    ( timeout "${DG_BUILD_TIMEOUT:-420}" python3 benchmarks/sglang_jit_build.py build --sglang-src "$DEEPGEMM_CARRY/sglang-src" \
        --out "$DGW/sgljit" --only topk_v2 --jobs 4; echo "sglang topk_v2 build exit $?" ) > "$OUT_DIR/sglang_topk_build.log" 2>&1 &
    SG_PID=$!
    export SGLANG_TOPK_BUILD="$DGW/sgljit" SGLANG_SRC="$DEEPGEMM_CARRY/sglang-src"
  fi
fi
SG_PID=${SG_PID:-}
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider --noconftest --maxfail=20 $TESTS \
  2>&1 | tee "$OUT_DIR/pytest.log" | tail -25
if [ -n "$DG_PID" ]; then
  wait "$DG_PID"; tail -3 "$OUT_DIR/deep_gemm_build.log"
  export PYTHONPATH="$PYTHONPATH:$DGW/dg/pkg"
  python3 -c "import deep_gemm; print('deep_gemm importable')" 2>&1 | tail -1
fi
if [ -n "$SG_PID" ]; then wait "$SG_PID"; tail -2 "$OUT_DIR/sglang_topk_build.log"; fi
[ -n "${SKIP_BENCH:-}" ] || timeout "${BENCH_TIMEOUT:-300}" python3 $B/bench.py --out "$OUT_DIR/bench.json" ${BENCH_ARGS:-} 2>&1 \
  | tee "$OUT_DIR/bench.log" | grep -v "^  \(naive\|chunked\)" | tail -60
[ -z "${HOST_BENCH:-}" ] || timeout "${HOST_BENCH_TIMEOUT:-240}" python3 $B/host.py \
  --out "$OUT_DIR/bench_host.json" 2>&1 | tee "$OUT_DIR/bench_host.log" | tail -45
[ -z "${FP4_BENCH:-}" ] || timeout "${FP4_BENCH_TIMEOUT:-300}" python3 $B/fp4.py \
  --out "$OUT_DIR/bench_fp4.json" 2>&1 | tee "$OUT_DIR/bench_fp4.log" | tail -30
[ -z "${TWO_STAGE_BENCH:-}" ] || timeout "${TWO_STAGE_BENCH_TIMEOUT:-300}" python3 $B/two_stage.py \
  --out "$OUT_DIR/bench_two_stage.json" 2>&1 | tee "$OUT_DIR/bench_two_stage.log" | tail -40
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
NCU_SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats"
profile() {  # profile NAME KERNEL_REGEX ARGS...: one warm launch (the second) of the kernel, under ncu
  local name=$1 regex=$2; shift 2
  timeout "${NCU_TIMEOUT:-120}" "$NCU" --clock-control none --kernel-name "regex:$regex" --launch-skip 1 --launch-count 1 \
    $NCU_SECTIONS --print-details all python3 $B/ncu_call.py "$@" > "$OUT_DIR/ncu_$name.txt" 2>&1 \
  || timeout "${NCU_TIMEOUT:-120}" "$NCU" --clock-control none --kernel-name "regex:$regex" --launch-skip 1 --launch-count 1 \
    $NCU_SECTIONS python3 $B/ncu_call.py "$@" > "$OUT_DIR/ncu_$name.txt" 2>&1
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Stall|Executed Ipc A|Compute \(SM\)|Memory Throughput|DRAM Throughput|Waves|Tail|Warp Cycles Per Issued" "$OUT_DIR/ncu_$name.txt" | head -40
}
# PROFILE_TOPK="rows width k method" (e.g. "4096 22016 1024 sample"); PROFILE_PAGED=fp8|bf16|fp4, or several
# comma-separated (the ragged B=64 batch; ncu_paged-KIND.txt each)
[ -z "${PROFILE_TOPK:-}" ] || profile topk "topk" topk $PROFILE_TOPK
for kind in ${PROFILE_PAGED:+${PROFILE_PAGED//,/ }}; do profile "paged-$kind" "paged_mqa_logits" paged-ragged "$kind"; done
