#!/usr/bin/env bash
# One device call: the kernel tests on CUDA, then the full-size benchmark.
# Usage (repo root, on the GPU machine): bash kernels/gpu_check.sh OUTDIR
# Env: TESTS (test files), TEST_TIMEOUT, SKIP_BENCH, BENCH_TIMEOUT, BENCH_ARGS (e.g. "--only topk,ragged"),
#      PROFILE_TOPK=1 (ncu on TOPK_SHAPE="rows width k", default "4096 22016 1024")
# Works without installing the package: niah.kernels is mapped by a symlink if needed.
set -u
OUT_DIR=${1:-/tmp/niah-kernels}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import niah.kernels" 2>/dev/null; then ln -sfn ../kernels niah/kernels; fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT_DIR/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT_DIR/gpu.txt"
TESTS=${TESTS:-tests/test_kernels_paged.py tests/test_kernels_mqa.py tests/test_kernels_store.py tests/test_kernels_topk.py}
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider --noconftest --maxfail=20 $TESTS \
  2>&1 | tee "$OUT_DIR/pytest.log" | tail -25
[ -n "${SKIP_BENCH:-}" ] || timeout "${BENCH_TIMEOUT:-300}" python3 -m niah.kernels.bench --out "$OUT_DIR/bench.json" ${BENCH_ARGS:-} 2>&1 \
  | tee "$OUT_DIR/bench.log" | grep -v "^  \(naive\|chunked\)" | tail -60
if [ -n "${PROFILE_TOPK:-}" ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 150 "$NCU" --clock-control none --kernel-name regex:topk --launch-count ${NCU_LAUNCHES:-3} \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis \
    python3 -c "import sys, torch; from niah.kernels import topk_indices; r,w,k=map(int,sys.argv[1:4]); \
x=torch.randn(r,w,device='cuda'); l=torch.full((r,),w,dtype=torch.int32,device='cuda'); topk_indices(x,k,l); torch.cuda.synchronize()" \
    ${TOPK_SHAPE:-4096 22016 1024} \
    > "$OUT_DIR/ncu_topk.txt" 2>&1
  grep -E "Duration|Registers|Achieved Occupancy|Theoretical Occupancy|Block Limit|Stall|Issue Slots|Executed Ipc|Compute \(SM\)|Memory Throughput|Warp Cycles" "$OUT_DIR/ncu_topk.txt" | head -60
fi
