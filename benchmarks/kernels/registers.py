"""What the compiler gives the prefill's indexer kernels on a GPU target, without a GPU: registers
a thread, bytes spilled (ptxas -v on Triton's PTX) and shared memory, at the launches' argument divisibility
(pointers and 16-aligned strides specialised as Triton specialises them at a launch).

    python benchmarks/kernels/registers.py [ARCH]      # 90 (H200) by default

Rows: `indexer_logits_kernel` at tiles x warps (fp8 and bf16 keys, SmolLM2's 3 kv heads x 4
padded heads x 64), its pages form (`indexer_logits_pages_kernel`) at rows x warps, the sample
select and the search kernel at radix widths 1, 2 and 4.
Register counts are not times: the timings are benchmarks/kernels/indexer_logits.py --tune,
topk_ties.py --radix-bits and bench.py --only topk, on a GPU.
"""

import os
import subprocess
import sys
import tempfile

import triton
import triton.backends.nvidia as nvidia
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ARCH = int(sys.argv[1]) if __name__ == "__main__" and len(sys.argv) > 1 else 90
PTXAS = os.path.join(os.path.dirname(nvidia.__file__), "bin", "ptxas")


def compile_for(fn, sig: dict, consts: dict, warps: int, aligned: tuple, arch: int = ARCH, stages: int | None = None):
    """The kernel compiled by Triton for sm_`arch` (no launch, no GPU), the names in `aligned`
    specialised as 16-divisible as a launch specialises them."""
    sig = {**sig, **{k: "constexpr" for k in consts}}
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    options = {"num_warps": warps} if stages is None else {"num_warps": warps, "num_stages": stages}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32), options=options)


def usage(fn, sig: dict, consts: dict, warps: int, aligned: tuple) -> str:
    k = compile_for(fn, sig, consts, warps, aligned)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(k.asm["ptx"])
        f.flush()
        out = subprocess.run([PTXAS, "-v", f"--gpu-name=sm_{ARCH}a" if ARCH >= 90 else f"--gpu-name=sm_{ARCH}",
                              f.name, "-o", os.devnull], capture_output=True, text=True, check=True).stderr
    regs = next(line.split("Used ")[1].split(" registers")[0] for line in out.splitlines() if "Used " in line)
    spill = next(line.split(", ")[1].split(" bytes")[0] for line in out.splitlines() if "spill stores" in line)
    return f"{regs} registers, {spill} bytes spilled, {k.metadata.shared} bytes of shared memory"


def main() -> None:
    from niah.kernels.fused_indexer.kernel import indexer_logits_kernel, indexer_logits_pages_kernel
    from niah.kernels.topk.kernel import topk_kernel
    from niah.kernels.topk.sample_kernel import sample_topk_kernel

    for fp8 in (True, False):
        t = "*fp8e4nv" if fp8 else "*bf16"
        sig = {"q_ptr": t, "w_ptr": "*fp32", "kv_ptr": t, "sf_ptr": "*fp32" if fp8 else "*bf16", "bt_ptr": "*i32",
               "out_ptr": "*fp32", "C": "i32", "p0": "i32", "stride_qc": "i32", "stride_wc": "i32",
               "stride_bt": "i32", "page_stride": "i32", "sf_page_stride": "i32", "stride_out": "i32"}
        aligned = ("q_ptr", "w_ptr", "kv_ptr", "sf_ptr", "bt_ptr", "out_ptr", "stride_qc", "page_stride",
                   "sf_page_stride", "stride_out")
        for bm, bn, w in ((16, 128, 4), (16, 128, 8), (16, 64, 8), (32, 128, 8), (16, 256, 8)):
            consts = dict(HKV=3, GP=4, D=64, BLOCK_M=bm, BLOCK_N=bn, PAGE=64, IS_FP8=fp8, UPCAST=False)
            print(f"indexer_logits {'fp8' if fp8 else 'bf16'} {bm}x{bn} {w} warps:",
                  usage(indexer_logits_kernel, sig, consts, w, aligned), flush=True)
        at = list(sig).index("stride_qc")            # the pages form's one more argument comes before the strides
        sig_p = dict([*sig.items()][:at] + [("pages_a_program", "i32")] + [*sig.items()][at:])
        for bm, w in ((16, 4), (16, 8), (32, 8)):
            consts = dict(HKV=3, GP=4, D=64, BLOCK_M=bm, PAGE=64, IS_FP8=fp8, UPCAST=False, STAGES=3)
            print(f"indexer_logits pages {'fp8' if fp8 else 'bf16'} {bm} rows {w} warps:",
                  usage(indexer_logits_pages_kernel, sig_p, consts, w, aligned), flush=True)
    sig = {"x_ptr": "*fp32", "len_ptr": "*i32", "out_ptr": "*i32", "skey_ptr": "*i32", "sidx_ptr": "*i32",
           "W": "i32", "K": "i32", "stride_x": "i32", "R_HI": "i32", "R_LO": "i32"}
    # the default launch at 1, 2, 4 bits; then programs of 1 and 2 warps, the scratch read in pieces
    for tile, warps, bits, pieces in ((2048, 8, 1, 0), (2048, 8, 2, 0), (2048, 8, 4, 0), (512, 1, 1, 512),
                                      (256, 1, 1, 256), (512, 2, 1, 512), (1024, 2, 1, 1024)):
        consts = dict(TILE=tile, NS=1024, STRIDE=32, CAP=4096, HAS_LEN=False, K_PAD=512, W_CONST=0, RADIX_BITS=bits,
                      SCRATCH_TILE=pieces, NARROW=False)
        held = f"in pieces of {pieces}" if pieces else "held"
        print(f"sample select, tile {tile}, {warps} warps, {bits} bits, scratch {held}:",
              usage(sample_topk_kernel, sig, consts, warps, ("x_ptr", "out_ptr", "skey_ptr", "sidx_ptr", "stride_x")),
              flush=True)
    sig = {"x_ptr": "*fp32", "idx_in_ptr": "*i32", "len_ptr": "*i32", "out_idx_ptr": "*i32", "out_key_ptr": "*i32",
           "thr_ptr": "*i32", "n_rows": "i32", "W": "i32", "K": "i32", "n_chunks": "i32", "stride_x": "i32",
           "stride_in": "i32", "stride_out": "i32"}
    for phase, block, warps in ((0, 16384, 16), (1, 8192, 8)):
        for bits in (1, 2, 4):
            consts = dict(BLOCK=block, ROWS=1, K_PAD=2048, FROM_KEYS=False, HAS_LEN=True, OUT_KEYS=False, PHASE=phase,
                          RADIX_BITS=bits)
            print(f"search phase {phase}, {block} keys, {warps} warps, {bits} bits:",
                  usage(topk_kernel, sig, consts, warps, ("x_ptr", "out_idx_ptr", "stride_x", "stride_out")),
                  flush=True)


if __name__ == "__main__":
    main()
