"""Compile the GPU server's decode-step kernels and its prefill's score and select kernels for sm_90
(H100 / H200) on a machine without a GPU, no launch: the interpreter runs code the compiler
refuses (a statement after a `return` in a constexpr branch is still built; a tensor past
Triton's largest), so this is the check a GPU run would otherwise be the first to make.

    python tests/kernels/compile_sm90.py        # TRITON_INTERPRET unset: triton.jit must compile

One line a kernel variant, OK or FAIL with the compiler's message; exit 1 if any failed.
"""

from __future__ import annotations

import importlib
import os
import sys

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("compile_sm90.py: unset TRITON_INTERPRET (interpreted kernels do not compile)")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from niah.kernels.topk.wrapper import fit_radix  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def compile_(mod: str, name: str, sig: dict, consts: dict, warps: int = 4) -> bool:
    fn = getattr(importlib.import_module(mod), name)
    sig = dict(sig)
    sig.update({k: "constexpr" for k in consts})
    try:
        triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=TARGET, options={"num_warps": warps})
    except Exception as e:  # noqa: BLE001 (every variant's result is reported)
        lines = [x.strip() for x in str(e).splitlines() if x.strip().strip("^")]
        print("FAIL", name, consts, type(e).__name__, " | ".join(lines[:1] + lines[-2:])[:400])
        return False
    print("OK", name, consts)
    return True


def variants():
    topk_sig = {"x_ptr": "*fp32", "idx_in_ptr": "*i32", "len_ptr": "*i32", "out_idx_ptr": "*i32",
                "out_key_ptr": "*i32", "thr_ptr": "*i32", "n_rows": "i32", "W": "i32", "K": "i32", "n_chunks": "i32",
                "stride_x": "i32", "stride_in": "i32", "stride_out": "i32"}
    # the search at the widest chunks a decode row and the k 2048 rounds launch, each radix width
    for block, k_pad in ((16384, 1024), (8192, 2048), (32768, 2048)):
        for bits in (1, 2, 4):
            yield ("niah.kernels.topk.kernel", "topk_kernel", topk_sig,
                   dict(BLOCK=block, ROWS=1, K_PAD=k_pad, FROM_KEYS=False, HAS_LEN=True, OUT_KEYS=False, PHASE=0,
                        RADIX_BITS=fit_radix(bits, block)), 16)
    attn_sig = {"q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*fp32", "idx_ptr": "*i32", "out_ptr": "*fp32",
                "part_ptr": "*fp32", "scale": "fp32", "stride_qt": "i32", "stride_qh": "i32", "stride_kh": "i32",
                "stride_ks": "i32", "stride_vh": "i32", "stride_vs": "i32", "stride_it": "i32", "stride_ot": "i32",
                "stride_oh": "i32", "n_heads": "i32"}
    for K in (512, 1024):
        for one_head in (True, False):
            for split in (0, 128):
                yield ("niah.serving.embedded.cuda.sparse_kernel", "sparse_attention_kernel", attn_sig,
                       dict(K=K, G=3, BLOCK_G=16, D=64, BLOCK_N=64, PRECISION="tf32x3", ONE_HEAD=one_head,
                            SPLIT_KEYS=split), 4)
    yield ("niah.serving.embedded.cuda.sparse_kernel", "sparse_attention_combine_kernel",
           {"part_ptr": "*fp32", "out_ptr": "*fp32", "stride_ot": "i32", "stride_oh": "i32"},
           dict(H=9, NS=8, BLOCK_S=8, D=64), 4)
    union_sig = {"q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*fp32", "pos_ptr": "*i32", "who_ptr": "*i32",
                 "count_ptr": "*i32", "out_ptr": "*fp32", "scale": "fp32", "T": "i32", "stride_qt": "i32",
                 "stride_qh": "i32", "stride_kh": "i32", "stride_ks": "i32", "stride_vh": "i32", "stride_vs": "i32",
                 "stride_pt": "i32", "stride_ot": "i32", "stride_oh": "i32"}
    for block_q in (4, 8):
        yield ("niah.serving.embedded.cuda.union_kernel", "union_attention_kernel", union_sig,
               dict(G=3, GP=4, BLOCK_Q=block_q, D=64, BLOCK_N=64, PRECISION="tf32x3", N_CONST=0), 4)
    for block_q, lp, nw in ((4, 4096, 4), (4, 2048, 4), (8, 8192, 8)):
        yield ("niah.serving.embedded.cuda.union_kernel", "tile_union_kernel",
               {"idx_ptr": "*i32", "pos_ptr": "*i32", "who_ptr": "*i32", "count_ptr": "*i32", "scratch_ptr": "*i32",
                "T": "i32", "stride_it": "i32", "stride_pt": "i32"},
               dict(K=lp // block_q, BLOCK_Q=block_q, LP=lp), nw)
    for block_q, k in ((4, 1024), (8, 512)):
        yield ("niah.serving.embedded.cuda.union_kernel", "tile_union_bitmap_kernel",
               {"idx_ptr": "*i32", "pos_ptr": "*i32", "who_ptr": "*i32", "count_ptr": "*i32", "bits_ptr": "*i32",
                "T": "i32", "W": "i32", "stride_it": "i32", "stride_pt": "i32"},
               dict(K=k, KP=k, BLOCK_Q=block_q, WB=256, W_CONST=0), 4)
    for fp8 in (True, False):
        yield ("niah.kernels.query_quant.kernel", "quantize_query_kernel",
               {"q_ptr": "*fp32", "out_ptr": "*fp8e4nv" if fp8 else "*bf16", "w_out_ptr": "*fp32", "weight": "fp32",
                "Hkv": "i32", "stride_n": "i32", "stride_h": "i32", "stride_g": "i32"},
               dict(G=3, GP=4, GB=4, D=64, IS_FP8=fp8, INTERP=False), 4)
    sample_sig = {"x_ptr": "*fp32", "len_ptr": "*i32", "out_ptr": "*i32", "skey_ptr": "*i32", "sidx_ptr": "*i32",
                  "W": "i32", "K": "i32", "stride_x": "i32", "R_HI": "i32", "R_LO": "i32"}
    for tile, scratch_tile, warps in ((2048, 0, 8), (256, 256, 1)):   # the prefill's select, both launches by rows
        yield ("niah.kernels.topk.sample_kernel", "sample_topk_kernel", sample_sig,
               dict(TILE=tile, NS=1024, STRIDE=32, CAP=4096, HAS_LEN=True, K_PAD=1024, W_CONST=0, RADIX_BITS=1,
                    SCRATCH_TILE=scratch_tile, NARROW=True), warps)
    for fp8 in (True, False):                      # the prefill's score calls, the default form
        t = "*fp8e4nv" if fp8 else "*bf16"
        yield ("niah.kernels.fused_indexer.kernel", "indexer_logits_pages_kernel",
               {"q_ptr": t, "w_ptr": "*fp32", "kv_ptr": t, "sf_ptr": "*fp32" if fp8 else t, "bt_ptr": "*i32",
                "out_ptr": "*fp32", "C": "i32", "p0": "i32", "pages_a_program": "i32", "stride_qc": "i32",
                "stride_wc": "i32", "stride_bt": "i32", "page_stride": "i32", "sf_page_stride": "i32",
                "stride_out": "i32"},
               dict(HKV=3, GP=4, D=64, BLOCK_M=16, PAGE=64, IS_FP8=fp8, UPCAST=False, STAGES=3), 4)


def main() -> int:
    ok = [compile_(*v) for v in variants()]
    print(f"{sum(ok)} of {len(ok)} compiled for sm_90")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
