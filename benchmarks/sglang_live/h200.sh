#!/usr/bin/env bash
# A live SGLang 0.5.16 on one H200 machine with no network, from what carry.sh made:
#
#   bash benchmarks/sglang_live/h200.sh STEP [STEP...]      steps: setup imports serve matrix
#
# setup    join .carry/sglang/site.tar.xz.part*, check its sha256, unpack to $SGL (SGLang and its
#          imports in $SGL/site, the shrunk DeepSeek-V3.2 folder in $SGL/model), install this
#          checkout's niah there (--no-deps)
# imports  import SGLang's server, scheduler, DeepSeek-V3.2 model and DSA backend; report versions
# serve    start one SGLang (stock: `python -m sglang.launch_server`) on the dummy-weight model,
#          wait for /health, one /generate, then stop it; its log in $OUT
# matrix   `niah sweep --matrix benchmarks/sglang_live/matrix.toml` from $SGL (LENGTHS, DEPTHS, TRIALS,
#          MATRIX_ARGS), then `niah report`; the run folder as $OUT/sglang-live.tgz
#
# Env: OUT (results), SGL (default /tmp/sgl), CARRY (default .carry/sglang of this checkout).
set -uo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
CARRY=${CARRY:-$HERE/.carry/sglang}
SGL=${SGL:-/tmp/sgl}
OUT=${OUT:-/tmp/out}
T0=$(date +%s)
mkdir -p "$OUT"
log() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
use() {
  # PYTHONSAFEPATH: the checkout's niah/ (without serving/, which the wheel maps in) must not shadow the installed one
  export PYTHONPATH=$SGL/site PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 NIAH_CACHE=/tmp/niah-cache
  # SGLang's JIT (DeepGEMM, flashinfer, its own kernels) builds with the machine's nvcc
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} SGLANG_DISABLE_REQUEST_LOGGING=1
}

setup() {
  mkdir -p "$SGL"
  (cd "$CARRY" && cat site.tar.xz.part* | sha256sum | cut -d' ' -f1 | diff - <(cut -d' ' -f1 sha256.txt)) \
    || { echo "carried parts: sha256 mismatch"; return 1; }
  cat "$CARRY"/site.tar.xz.part* | xz -d -T0 | tar xf - -C "$SGL" || return 1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SGL/site" "$HERE" \
    >/dev/null || return 1
  use
  log "setup done ($(du -sm "$SGL" | cut -f1) MB)"
}

imports() {
  use
  python3 - <<'EOF'
# Every module a missing import stops: each is noted, replaced by an empty module for this check only
# (never for the server), and the imports tried again, so one call lists all that is missing.
import importlib, importlib.abc, importlib.machinery, sys, time, types
missing = []
class Note(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.split(".")[0] in missing else None
    def create_module(self, spec):
        m = types.ModuleType(spec.name); m.__path__ = []; return m
    def exec_module(self, module):
        pass
sys.meta_path.append(Note())
t = time.time()
mods = ["torch", "sgl_kernel", "flashinfer", "deep_gemm", "transformers", "sglang", "sglang.launch_server",
        "sglang.srt.entrypoints.http_server", "sglang.srt.managers.scheduler", "sglang.srt.managers.tokenizer_manager",
        "sglang.srt.managers.detokenizer_manager", "sglang.srt.model_executor.model_runner",
        "sglang.srt.models.deepseek_v2", "sglang.srt.layers.attention.dsa_backend",
        "sglang.srt.layers.attention.dsa.dsa_indexer", "niah.serving.sglang"]
for m in mods:
    for _ in range(30):
        try:
            mod = importlib.import_module(m)
            print("ok  ", m, getattr(mod, "__version__", ""))
            break
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if not top or top in missing:
                print("FAIL", m, e); break
            missing.append(top)
            for k in [k for k in sys.modules if k == m or k.startswith(m.split(".")[0] + ".")]:
                sys.modules.pop(k, None)
        except BaseException as e:
            print("FAIL", m, type(e).__name__, str(e)[:400]); break
print("missing:", " ".join(missing) or "none")
print(f"imports: {time.time() - t:.1f} s", file=sys.stderr)
EOF
  nvcc --version | tail -1
  log "imports done"
}

serve() {   # one stock server on the dummy-weight model, one request
  use
  local port=30123 log=$OUT/serve-stock.log
  python3 -m sglang.launch_server --model-path "$SGL/model" --load-format dummy --port $port \
    --kv-cache-dtype bfloat16 --dsa-prefill-backend flashmla_sparse --dsa-decode-backend flashmla_sparse \
    --sampling-backend pytorch --grammar-backend none --disable-cuda-graph --mem-fraction-static 0.5 \
    --context-length 32768 --json-model-override-args '{"index_topk": 512}' > "$log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 ${SERVE_WAIT_S:-300}); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  log "server: $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$port/health)"
  curl -s "http://127.0.0.1:$port/generate" -H 'content-type: application/json' \
    -d '{"text": "The secret number is", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}' | head -c 600; echo
  kill $pid 2>/dev/null; sleep 3; kill -9 $pid 2>/dev/null
  grep -E "Error|error|Traceback|Set DSA|KV Cache|max_total_num_tokens|ready" "$log" | head -40
  tail -30 "$log"
  log "serve done"
}

matrix() {   # the live sweep: one real SGLang per configuration, through niah's matrix runner
  use
  # run from $SGL with relative paths (model, run folder), so the run folder names no machine path
  sed "s#@MODEL@#model#" "$HERE/benchmarks/sglang_live/matrix.toml" > "$SGL/matrix.toml"
  rm -rf "$SGL/sglang-live"
  (cd "$SGL" && timeout -s INT "${MATRIX_LIMIT_S:-420}" python3 -m niah sweep --matrix matrix.toml \
    --lengths "${LENGTHS:-300,2000,4000,8000,16000,22600}" --depths "${DEPTHS:-10,50,90}" --trials "${TRIALS:-1}" \
    --out sglang-live ${MATRIX_ARGS:-}) 2>&1 | tail -40
  (cd "$SGL" && python3 -m niah report sglang-live 2>&1 | tail -3; tar czf "$OUT/sglang-live.tgz" sglang-live)
  log "matrix done"
}

for step in "$@"; do
  "$step" || { log "$step failed"; exit 1; }
done
