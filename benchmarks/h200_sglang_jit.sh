#!/usr/bin/env bash
# SGLang's JIT kernels, DeepGEMM and niah's kernels side by side on one H200, in ONE device call (repo root, OUT set by the device tool, `carry: [".carry"]`
# made by benchmarks/prepare_carry.sh):
#
#   bash benchmarks/h200_sglang_jit.sh
#
# Stages, each bounded by `timeout` and by one overall deadline (BUDGET_S, default 540 s), none
# stopping the later ones when it fails:
#   0. environment (GPU, driver, torch, triton, nvcc, compilers) and the carried tvm-ffi wheel
#      installed into $WORK/site (WORK: a scratch folder, default a fresh mktemp -d)
#   1. in the background: DeepGEMM's host code built against this torch (build_deep_gemm.sh), and
#      the kernel tests (pytest tests/kernels on CUDA)
#   2. SGLang 0.5.23's JIT kernels compiled as its loader does (sglang_jit_build.py, parallel nvcc)
#   3. the evidence against them (sglang_jit_evidence.py; the kernel tests may still be running)
#   4. benchmarks/kernels/host.py, once the tests are done, with DeepGEMM importable when
#      its build worked
# Files in $OUT (8 at most come back): h200-sglang-jit.log (environment, builds, DeepGEMM),
# sglang-jit-manifest.json, h200-sglang-jit-evidence.{json,log}, h200-bench-host.{json,log},
# h200-kernels-pytest.log.
set -u
: "${OUT:?OUT must be set (the device tool sets it)}"
BUDGET_S=${BUDGET_S:-540}
T0=$(date +%s)
C=$PWD/.carry
if [ -n "${WORK:-}" ]; then W=$WORK; rm -rf "$W" && mkdir -p "$W"; else W=$(mktemp -d); fi  # scratch: site-packages, builds
LOG=$OUT/h200-sglang-jit.log
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
cap() { local l; l=$(( $(left) - $2 )); [ "$l" -lt "$1" ] && echo $(( l > 10 ? l : 10 )) || echo "$1"; }  # cap MAX RESERVE
stage() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }

stage "0. environment"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  nproc; command -v nvcc ninja c++; nvcc --version | tail -2; c++ --version | head -1; ninja --version
  ls -la "$C" "$C/wheels"
} >> "$LOG" 2>&1
if [ -z "${CUDA_HOME:-}" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then export CUDA_HOME=/usr/local/cuda
  elif command -v nvcc >/dev/null; then CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); export CUDA_HOME; fi
fi
command -v ninja >/dev/null || PATH="$(python3 -c 'import ninja; print(ninja.BIN_DIR)' 2>/dev/null):$PATH"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/site" \
  "$C"/wheels/apache_tvm_ffi-*.whl >> "$LOG" 2>&1
export PYTHONPATH="$PWD:$PWD/tests:$W/site${PYTHONPATH:+:$PYTHONPATH}"  # tests/: helpers the tests import (--noconftest)
python3 -c "import niah.kernels" 2>/dev/null || ln -sfn ../kernels niah/kernels
python3 -c "import niah.serving" 2>/dev/null || ln -sfn ../serving niah/serving
python3 -c "import tvm_ffi, niah.kernels; print('tvm_ffi', tvm_ffi.__version__, '; CUDA_HOME', '${CUDA_HOME:-}')" >> "$LOG" 2>&1

# tests/sglang_source.py reads SGLang's modules from a wheel: the carried files, zipped as one
python3 - "$C/sglang-src" "$W/sglcache/sglang-0.5.23-carried.whl" <<'PYEOF' >> "$LOG" 2>&1
import os, sys, zipfile
src, dest = sys.argv[1:]
os.makedirs(os.path.dirname(dest), exist_ok=True)
with zipfile.ZipFile(dest, "w") as z:
    for d, _, files in os.walk(src):
        for f in files:
            z.write(os.path.join(d, f), os.path.relpath(os.path.join(d, f), src))
print("carried SGLang files zipped for the tests:", dest)
PYEOF
export SGLANG_SRC_CACHE="$W/sglcache"

stage "1. background: DeepGEMM build, kernel tests"
DG_PID=
if [ -f "$C/deepgemm-src.tar.gz" ]; then
  ( timeout "$(cap 420 60)" bash benchmarks/build_deep_gemm.sh "$C" "$W/dg"; echo "deep_gemm build exit $?" ) \
    > "$W/dg.log" 2>&1 &
  DG_PID=$!
else
  echo "no DeepGEMM source in .carry: DeepGEMM not built" > "$W/dg.log"
fi
( timeout "$(cap 200 300)" python3 -m pytest -q -p no:cacheprovider --noconftest --maxfail=30 tests/kernels tests/sglang/test_attest_cuda_graph.py \
    > "$OUT/h200-kernels-pytest.log" 2>&1; echo "pytest exit $?" >> "$OUT/h200-kernels-pytest.log" ) &
PT_PID=$!

stage "2. SGLang JIT kernels (nvcc, sm_90a, through SGLang's own loader code)"
timeout "$(cap 270 240)" python3 benchmarks/sglang_jit_build.py build --sglang-src "$C/sglang-src" --out "$W/sgljit" \
  --jobs 12 >> "$LOG" 2>&1
echo "build exit $?" >> "$LOG"
cp "$W/sgljit/manifest.json" "$OUT/sglang-jit-manifest.json" 2>/dev/null

stage "3. evidence"
kill -0 "$PT_PID" 2>/dev/null && echo "(kernel tests still running beside it: its store timings may be perturbed)" >> "$LOG"
timeout "$(cap 240 100)" python3 benchmarks/sglang_jit_evidence.py --sglang-src "$C/sglang-src" --build "$W/sgljit" \
  --out "$OUT" --name h200-sglang-jit-evidence > "$OUT/h200-sglang-jit-evidence.log" 2>&1
echo "evidence exit $?" >> "$LOG"
tail -3 "$OUT/h200-sglang-jit-evidence.log" >> "$LOG"

stage "4. DeepGEMM and the host-cost benchmark (after the kernel tests: a quiet GPU for timings)"
wait "$PT_PID"; tail -3 "$OUT/h200-kernels-pytest.log" >> "$LOG"
[ -n "$DG_PID" ] && wait "$DG_PID"
cat "$W/dg.log" >> "$LOG"
DGP=; [ -f "$W/dg/pkg/deep_gemm/_C.so" ] && DGP=$W/dg/pkg:
PYTHONPATH="$DGP$PYTHONPATH" timeout "$(cap 200 5)" python3 benchmarks/kernels/host.py --out "$OUT/h200-bench-host.json" \
  > "$OUT/h200-bench-host.log" 2>&1
echo "host benchmark exit $?" >> "$LOG"
stage "done"
