#!/usr/bin/env bash
# Recreate .carry/ (git-ignored) for benchmarks/h200_sglang_jit.sh, which the GPU machine reads
# (the device tool's `carry: [".carry"]`; it has no network). Everything comes from public
# packages and one public commit:
#   .carry/wheels/apache_tvm_ffi-0.1.11-*.whl     SGLang 0.5.23's tvm-ffi pin (cp312 abi3)
#   .carry/wheels/sgl_deep_gemm-0.2.3.post2-*.whl CuTe/CUTLASS headers for the DeepGEMM build
#   .carry/sglang-src/sglang/...                  from the sglang 0.5.23 wheel: kernels/jit/include,
#                                                 the .cuh files built, the Python files lifted
#                                                 (the list: benchmarks/sglang_jit_build.py)
#   .carry/deepgemm-src.tar.gz                    sgl-project/DeepGEMM at DEEPGEMM_COMMIT:
#                                                 csrc/, deep_gemm/, sgl_deep_gemm/
#
#   bash benchmarks/prepare_carry.sh [REPO_ROOT]
#
# Env: DEEPGEMM_GIT  a git clone of https://github.com/sgl-project/DeepGEMM holding DEEPGEMM_COMMIT
#                    (without it, and without network to clone, .carry has no DeepGEMM source and
#                    the driver skips that build);
#      SGLANG_SRC_CACHE  where the sglang 0.5.23 wheel is (default REPO_ROOT/.cache/sglang; else pip download);
#      PYTHON (default REPO_ROOT/.venv/bin/python, else python3).
set -euo pipefail
ROOT=$(cd "${1:-$(dirname "$0")/..}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
CARRY=$ROOT/.carry
DEEPGEMM_COMMIT=2176dff556d6fb8f0184516dc224a3b31a094b98  # dev, 2026-06-12: the newest public tvm-ffi host code
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
CACHE=${SGLANG_SRC_CACHE:-$ROOT/.cache/sglang}
WHL=$ROOT/.whl
rm -rf "$CARRY" && mkdir -p "$CARRY/wheels" "$WHL" "$CACHE"

fetch() {  # fetch NAME==VERSION GLOB: the cp312 manylinux wheel into .whl/ (the device README's recipe)
  ls "$WHL"/$2 >/dev/null 2>&1 || "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHL" "$1"
  cp "$(ls "$WHL"/$2 | head -1)" "$CARRY/wheels/"
}
fetch apache-tvm-ffi==0.1.11 'apache_tvm_ffi-0.1.11-*.whl'
fetch sgl-deep-gemm==0.2.3.post2 'sgl_deep_gemm-0.2.3.post2-*.whl'

SGL=$(ls "$CACHE"/sglang-0.5.23-*.whl 2>/dev/null | head -1 || true)
if [ -z "$SGL" ]; then
  "$PY" -m pip download -q --no-deps sglang==0.5.23 -d "$CACHE"
  SGL=$(ls "$CACHE"/sglang-0.5.23-*.whl | head -1)
fi
"$PY" "$HERE/sglang_jit_build.py" extract --wheel "$SGL" --dest "$CARRY/sglang-src"

GIT=${DEEPGEMM_GIT:-}
if [ -z "$GIT" ] && git clone -q --filter=blob:none https://github.com/sgl-project/DeepGEMM "$ROOT/.cache/deepgemm" 2>/dev/null; then
  GIT=$ROOT/.cache/deepgemm
fi
if [ -n "$GIT" ] && git -C "$GIT" cat-file -e "$DEEPGEMM_COMMIT^{commit}" 2>/dev/null; then
  git -C "$GIT" archive --format=tar "$DEEPGEMM_COMMIT" csrc deep_gemm sgl_deep_gemm | gzip -9 > "$CARRY/deepgemm-src.tar.gz"
  echo "DeepGEMM source: sgl-project/DeepGEMM $DEEPGEMM_COMMIT"
else
  echo "DeepGEMM source: not carried (set DEEPGEMM_GIT to a clone holding $DEEPGEMM_COMMIT)"
fi
SIZE=$(du -sm "$CARRY" | cut -f1)
echo "$CARRY: ${SIZE} MiB"; ls -la "$CARRY" "$CARRY/wheels"
[ "$SIZE" -le 40 ] || { echo "prepare_carry: .carry is over 40 MiB" >&2; exit 1; }
