#!/usr/bin/env bash
# Build DeepGEMM (SGLang's fork, the tvm-ffi flavour) against the machine's torch, for
# benchmarks/kernels/host.py's comparison (niah's eager host cost beside DeepGEMM's). The sgl-deep-gemm 0.2.3.post2 wheel's
# _C.so was built for torch 2.14.1 and does not load into torch 2.11; its source (TORCH_LIBRARY,
# DeepJIT) is not public in any snapshot we can fetch. What is built instead: the host code of
# sgl-project/DeepGEMM `dev` at DEEPGEMM_COMMIT (csrc/tvm_ffi_api.cpp, as its
# build_sgl_deep_gemm.sh stages and compiles it), its deep_gemm/include kernels, CUTLASS/CuTe
# headers from the 0.2.3.post2 wheel's include/ (the source pins NVIDIA/cutlass f3fde58 as a
# submodule, not in the snapshot), fmt from torch's bundled headers (FMT_HEADER_ONLY).
#
#   bash benchmarks/build_deep_gemm.sh CARRY DEST [--compile-only]
#
# CARRY: the folder benchmarks/prepare_carry.sh fills (deepgemm-src.tar.gz, wheels/sgl_deep_gemm-*.whl);
# EXTRA_INCLUDE: more include folders (space-separated), e.g. CUDA library headers a minimal toolkit lacks.
# DEST: where the importable package goes (DEST/pkg/deep_gemm; use PYTHONPATH=DEST/pkg).
# tvm_ffi must be importable (the carried wheel, installed into the driver's scratch site folder).
# --compile-only: compile to an object file and stop (a machine without CUDA torch libraries).
# Prints one line per step; exit status 0 only when `import deep_gemm` works (or the object compiled).
set -u
CARRY=${1:?usage: build_deep_gemm.sh CARRY DEST [--compile-only]}
DEST=${2:?usage: build_deep_gemm.sh CARRY DEST [--compile-only]}
MODE=${3:-}
CARRY=$(cd "$CARRY" && pwd)
PY=${PYTHON:-python3}
SRC=$DEST/src
PKG=$DEST/pkg/deep_gemm
rm -rf "$DEST" && mkdir -p "$SRC" "$PKG/include" || exit 1
t0=$(date +%s)

tar xzf "$CARRY/deepgemm-src.tar.gz" -C "$SRC" || { echo "deep_gemm: no source archive in $CARRY"; exit 1; }
WHEEL=$(ls "$CARRY"/wheels/sgl_deep_gemm-*.whl 2>/dev/null | head -1)
[ -n "$WHEEL" ] || { echo "deep_gemm: no sgl_deep_gemm wheel in $CARRY/wheels"; exit 1; }
# the package as build_sgl_deep_gemm.sh stages it; CuTe/CUTLASS out of the wheel
cp "$SRC/sgl_deep_gemm/__init__.py" "$PKG/" && tr -d '[:space:]' < "$SRC/sgl_deep_gemm/VERSION" > "$PKG/VERSION"
for sub in utils testing legacy mega; do cp -r "$SRC/deep_gemm/$sub" "$PKG/"; done
cp -r "$SRC/deep_gemm/include/deep_gemm" "$PKG/include/"
"$PY" - "$WHEEL" "$PKG/include" <<'PYEOF' || exit 1
import shutil, sys, tempfile, zipfile
wheel, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as tmp:
    names = [n for n in z.namelist() if n.startswith(("deep_gemm/include/cute/", "deep_gemm/include/cutlass/"))]
    for n in names:
        z.extract(n, tmp)
    for d in ("cute", "cutlass"):
        shutil.copytree(f"{tmp}/deep_gemm/include/{d}", f"{dest}/{d}")
print(f"deep_gemm: {len(names)} CuTe/CUTLASS headers from {wheel.rsplit('/', 1)[-1]}")
PYEOF

# every path from the Python that will import it
PATHS=$("$PY" - <<'PYEOF'
import os, shutil, sysconfig, torch
t = os.path.dirname(torch.__file__)
nvcc = shutil.which("nvcc")
cuda = os.environ.get("CUDA_HOME") or (os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else "/usr/local/cuda")
try:
    from tvm_ffi.libinfo import find_include_path, find_dlpack_include_path, find_libtvm_ffi
    tinc = " ".join(dict.fromkeys([find_include_path(), find_dlpack_include_path()]))
    tlib = os.path.dirname(find_libtvm_ffi())
except Exception:  # a Python that cannot import the carried tvm-ffi (compile check elsewhere)
    tinc, tlib = os.environ.get("TVM_FFI_INCLUDE", ""), os.environ.get("TVM_FFI_LIB", "")
import glob
site = os.path.dirname(t)
nvinc = sorted(glob.glob(f"{site}/nvidia/*/include") + glob.glob(f"{site}/nvidia/*/*/include"))
def lib(name):  # -L/-l when an unversioned .so exists, else the versioned file by path (pip CUDA wheels)
    dirs = [f"{cuda}/lib64", f"{cuda}/lib", f"{t}/lib"] + sorted(glob.glob(f"{site}/nvidia/*/lib") + glob.glob(f"{site}/nvidia/*/*/lib"))
    for d in dirs:
        if os.path.exists(f"{d}/lib{name}.so"):
            return f"-L{d} -l{name} -Wl,-rpath,{d}"
    for d in dirs:
        hits = sorted(glob.glob(f"{d}/lib{name}.so.*"))
        if hits:
            return f"{hits[0]} -Wl,-rpath,{d}"
    return f"-l{name}"
print(f"TORCH={t} CUDA={cuda} PYINC={sysconfig.get_path('include')} ABI={int(torch.compiled_with_cxx11_abi())}")
print(f"NVINC='{' '.join(nvinc)}'")
print("CUDALIBS='" + " ".join(lib(n) for n in ("cudart", "nvrtc", "cublasLt", "cublas")) + "'")
print(f"TVMINC='{tinc}' TVMLIB='{tlib}'")
PYEOF
) || { echo "deep_gemm: $PY cannot import torch: not built"; exit 1; }
eval "$PATHS"
[ -f "$PYINC/Python.h" ] || echo "deep_gemm: warning: no Python.h under $PYINC (torch/python.h needs it)"
INC=""
for d in $TVMINC "$CUDA/include" $NVINC ${EXTRA_INCLUDE:-} "$PYINC" "$TORCH/include" "$TORCH/include/torch/csrc/api/include" "$PKG/include"; do
  INC="$INC -I$d"
done
[ -d "$CUDA/include/cccl" ] && INC="$INC -I$CUDA/include/cccl"
CXX=${CXX:-c++}
FLAGS="-std=c++17 -O3 -fPIC -Wno-psabi -Wno-deprecated-declarations -D_GLIBCXX_USE_CXX11_ABI=$ABI"
echo "deep_gemm: $($CXX --version | head -1); torch $TORCH; CUDA $CUDA"
if [ "$MODE" = "--compile-only" ]; then
  $CXX $FLAGS $INC -c "$SRC/csrc/tvm_ffi_api.cpp" -o "$DEST/tvm_ffi_api.o" || { echo "deep_gemm: compile FAILED"; exit 1; }
  echo "deep_gemm: compiled $DEST/tvm_ffi_api.o in $(( $(date +%s) - t0 )) s (compile only)"; exit 0
fi
# the system libstdc++ named explicitly (a private copy crashed at load before); rpaths for the rest
STDCXX=$($CXX -print-file-name=libstdc++.so)
[ -f "$STDCXX" ] || STDCXX=$($CXX -print-file-name=libstdc++.so.6)  # no dev symlink: the runtime library by path
[ -f "$STDCXX" ] || STDCXX=$(ls /usr/lib/x86_64-linux-gnu/libstdc++.so.6 /lib/x86_64-linux-gnu/libstdc++.so.6 2>/dev/null | head -1)
echo "deep_gemm: libstdc++ $STDCXX"
LIBS="-shared -L$TVMLIB -ltvm_ffi $CUDALIBS -L$TORCH/lib -ltorch -ltorch_cpu -lc10 -lc10_cuda -ltorch_cuda \
 $STDCXX -Wl,-rpath,$TORCH/lib -Wl,-rpath,$TVMLIB"
$CXX $FLAGS $INC "$SRC/csrc/tvm_ffi_api.cpp" -o "$PKG/_C.so" $LIBS || { echo "deep_gemm: build FAILED"; exit 1; }
echo "deep_gemm: built $PKG/_C.so in $(( $(date +%s) - t0 )) s"
PYTHONPATH="$DEST/pkg${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "
import deep_gemm, torch
print('deep_gemm: import ok', deep_gemm.__version__, deep_gemm.__file__, 'num_sms', deep_gemm.get_num_sms())
" || { echo "deep_gemm: import FAILED"; exit 1; }
