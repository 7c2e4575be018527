"""Compile the fp4 kernels for a CUDA target on a machine without a GPU (no launch):

    python benchmarks/kernels/fp4_compile.py 90     # sm_90 (H200); 100 for sm_100 (B200)

The interpreter accepts code the compiler refuses; this is the check before a GPU run. It
prints OK (with the PTX size) or the compiler's error for each kernel and variant.
"""

import importlib
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

target = GPUTarget("cuda", int(sys.argv[1]) if len(sys.argv) > 1 else 90, 32)
failed = 0


def compile_(mod, name, sig, consts):
    global failed
    fn = getattr(importlib.import_module(mod), name)
    try:
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target,
                           options={"num_warps": 4})
        print("OK", name, {k2: v for k2, v in consts.items() if k2 in ("Q_FP4", "SCALED", "FP8_CVT", "FP8_MMA")},
              len(k.asm.get("ptx", "")))
    except Exception as e:  # noqa: BLE001 (report every kernel's result)
        failed += 1
        cause = e
        while cause.__cause__ or cause.__context__:   # the compiler's own message is at the chain's end
            cause = cause.__cause__ or cause.__context__
        print("FAIL", name, consts, type(e).__name__, str(e)[:1500], "|", type(cause).__name__, str(cause)[-800:])


store_sig = {"k_ptr": "*bf16", "slot_ptr": "*i64", "cache_ptr": "*u8", "N": "i32", "stride_k": "i32",
             "page_stride": "i32",
             "D": "constexpr", "BLOCK_T": "constexpr", "BLOCK_KV": "constexpr", "RNE": "constexpr"}
compile_("niah.kernels.fp4_store.kernel", "store_fp4_index_keys_kernel", store_sig,
         {"D": 128, "BLOCK_T": 16, "BLOCK_KV": 64, "RNE": False})
names = ["q_ptr", "qe_ptr", "kv_ptr", "w_ptr", "ctx_ptr", "bt_ptr", "out_ptr"]
types_ = ["*bf16", "*u8", "*u8", "*fp32", "*i32", "*i32", "*fp32"]
CVTS = (True, False) if target.arch >= 89 else (False,)   # the fp8-conversion decode needs sm_89+
VARIANTS = [(v, c, False) for v in ((False, False), (True, False), (True, True)) for c in CVTS]
if target.arch >= 89:   # the fp8 MMA path (fp4 query)
    VARIANTS.append(((True, False), True, True))
for (q_fp4, scaled), cvt, fp8 in VARIANTS:
    sig = dict(zip(names, types_))
    if q_fp4:
        sig["q_ptr"] = "*u8"
    sig.update({k: "i32" for k in ["H", "max_context_len", "max_pages", "stride_ctx", "stride_bt", "page_stride"]})
    consts = dict(PAGES_PER_SPLIT=8, NEXT_N=1, CTX_2D=False, D=128, BLOCK_H=64, BLOCK_KV=64, Q_FP4=q_fp4, SCALED=scaled,
                  CLEAN=False, UPCAST=False, LIVE_LOOP=True, FP8_CVT=cvt, FP8_MMA=fp8)
    sig.update({k: "constexpr" for k in consts})
    compile_("niah.kernels.fp4_paged_logits.kernel", "fp4_paged_mqa_logits_kernel", sig, consts)
for q_fp4, cvt in ((q, c) for q in (False, True) for c in CVTS):
    sig = {"q_ptr": "*u8" if q_fp4 else "*bf16", "qe_ptr": "*u8", "kc_ptr": "*u8", "ke8_ptr": "*u8", "w_ptr": "*fp32",
           "ks_ptr": "*i32", "ke_ptr": "*i32", "out_ptr": "*fp32", "S": "i32", "Skv": "i32", "H": "i32",
           "stride_out": "i32"}
    consts = dict(D=128, BLOCK_H=64, BLOCK_N=128, BLOCK_Q=16, Q_FP4=q_fp4, CLEAN=True, UPCAST=False, FP8_CVT=cvt)
    sig.update({k: "constexpr" for k in consts})
    compile_("niah.kernels.fp4_mqa_logits.kernel", "fp4_mqa_logits_kernel", sig, consts)
sys.exit(1 if failed else 0)
