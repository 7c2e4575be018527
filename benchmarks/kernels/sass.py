"""What a decode logits kernel's page loop costs in instructions, for a GPU target, without a GPU:
each kernel compiled by Triton and ptxas for sm_90a, disassembled (nvdisasm, bundled with
Triton), and the loop that holds its tensor-core products (HGMMA) counted by opcode.

    python benchmarks/kernels/sass.py [--json OUT] [--only fp4]     # --only: rows whose name holds it

Rows: niah's fp8 paged logits (the launch `fp8_paged_mqa_logits` makes for a decode step) and the
fp4 paged logits' paths (unpack with an fp4 or a bf16 query, the fp8-MMA path, the f16 path), H = 64,
D = 128, 4 warps. A page loop's instructions are issued once a page by each of the program's
warps; dividing by the page's 64 keys gives "a key". Counts are not times (a tensor-core product
or a load costs more than an integer operation, and the compiler may unroll): the timings are
benchmarks/kernels/fp4.py on a GPU. What they do say without a GPU: where a path spends its
instructions (the decode of the codes, conversions, shared-memory round trips and barriers)
beside the fp8 path that runs near DeepGEMM's speed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import tempfile

import triton
import triton.backends.nvidia as nvidia
from registers import compile_for

ARCH = 90
BIN = os.path.join(os.path.dirname(nvidia.__file__), "bin")
LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
BRANCH = re.compile(r"\bBRA\b.*?(\.L_x_\d+)")
# opcode classes (the first word of the opcode)
CLASSES = {
    "tensor core": ("HGMMA", "WARPGROUP", "HMMA", "QGMMA"),
    "shared memory": ("LDS", "STS", "LDSM", "STSM"),
    "global memory": ("LDG", "STG", "LDGSTS", "UBLKCP", "SYNCS", "LDGDEPBAR", "DEPBAR"),
    "barrier": ("BAR", "WARPSYNC", "MEMBAR", "FENCE"),
    "conversion": ("F2FP", "F2F", "I2F", "F2I", "I2FP", "HADD2", "HMUL2", "HFMA2"),
    "fp32": ("FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP", "FCHK"),
    "integer": ("IMAD", "IADD3", "LOP3", "SHF", "PRMT", "LEA", "ISETP", "SEL", "IABS", "BMSK", "SGXT", "IMNMX",
                "POPC", "FLO", "BREV", "MOV", "SHL", "SHR", "IMUL", "UIADD3", "ULOP3", "USHF", "UMOV", "UIMAD",
                "ULEA", "UISETP", "USEL", "UPRMT", "S2R", "S2UR", "R2UR", "CS2R"),
    "warp shuffle": ("SHFL", "VOTE", "REDUX"),
}


def classify(op: str) -> str:
    base = op.split(".")[0]
    for name, ops in CLASSES.items():
        if base in ops:
            return name
    return "other"


def sass(fn, sig: dict, consts: dict, warps: int, stages: int, aligned: tuple) -> str:
    """The kernel's SASS for sm_90a (nvdisasm's text)."""
    k = compile_for(fn, sig, consts, warps, aligned, arch=ARCH, stages=stages)
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(ptx, "w") as f:
            f.write(k.asm["ptx"])
        subprocess.run([os.path.join(BIN, "ptxas"), f"--gpu-name=sm_{ARCH}a", ptx, "-o", cubin], check=True)
        return subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", cubin], capture_output=True, text=True,
                              check=True).stdout


def loops(text: str) -> list[list[str]]:
    """Each backward branch's body (label .. branch), as opcode lists, innermost first by size."""
    ops: list[str] = []
    labels: dict[str, int] = {}
    bodies = []
    for line in text.splitlines():
        m = LABEL.match(line)
        if m:
            labels[m.group(1)] = len(ops)
            continue
        m = LINE.search(line)
        if not m:
            continue
        ops.append(m.group(3))
        b = BRANCH.search(line)
        if b and b.group(1) in labels:
            bodies.append(ops[labels[b.group(1)]:])
    return sorted(bodies, key=len)


def page_loop(text: str) -> list[str]:
    """The smallest loop holding a tensor-core product: the page loop."""
    for body in loops(text):
        if any(classify(op) == "tensor core" for op in body):
            return body
    raise RuntimeError("no loop holds a tensor-core product")


def count(text: str) -> dict:
    body = page_loop(text)
    by_class = collections.Counter(classify(op) for op in body)
    top = collections.Counter(op for op in body).most_common(12)
    return {"instructions": len(body), "a key (4 warps / 64 keys)": round(4 * len(body) / 64, 1),
            "by class": dict(by_class.most_common()), "top opcodes": dict(top)}


def fp8_kernel():
    from niah.kernels.paged_logits.kernel import paged_mqa_logits_kernel

    sig = {"q_ptr": "*fp8e4nv", "kv_ptr": "*fp8e4nv", "sf_ptr": "*fp32", "w_ptr": "*fp32", "ctx_ptr": "*i32",
           "bt_ptr": "*i32", "out_ptr": "*fp32", "H": "i32", "max_context_len": "i32", "max_pages": "i32",
           "stride_qb": "i32", "stride_qn": "i32", "stride_qh": "i32", "stride_w": "i32", "stride_ctx": "i32",
           "stride_bt": "i32", "stride_out": "i32", "page_stride": "i32", "sf_page_stride": "i32"}
    consts = dict(PAGES_PER_SPLIT=16, NEXT_N=1, CTX_2D=False, D=128, BLOCK_H=64, BLOCK_KV=64, IS_FP8=True,
                  CLEAN=False, UPCAST=False, LIVE_LOOP=True)
    aligned = ("q_ptr", "kv_ptr", "sf_ptr", "w_ptr", "bt_ptr", "out_ptr", "stride_qb", "stride_w", "stride_out",
               "page_stride", "sf_page_stride")
    return sass(paged_mqa_logits_kernel, sig, consts, 4, 3, aligned)


def fp4_kernel(q_fp4: bool, mma: str):
    from niah.kernels.fp4_paged_logits.kernel import fp4_paged_mqa_logits_kernel

    sig = {"q_ptr": "*u8" if q_fp4 else "*bf16", "qe_ptr": "*u8", "kv_ptr": "*u8", "w_ptr": "*fp32",
           "ctx_ptr": "*i32", "bt_ptr": "*i32", "out_ptr": "*fp32", "H": "i32", "max_context_len": "i32",
           "max_pages": "i32", "stride_ctx": "i32", "stride_bt": "i32", "page_stride": "i32"}
    consts = dict(PAGES_PER_SPLIT=8, NEXT_N=1, CTX_2D=False, D=128, BLOCK_H=64, BLOCK_KV=64, Q_FP4=q_fp4,
                  SCALED=False, CLEAN=False, UPCAST=False, LIVE_LOOP=True, FP8_CVT=True, FP8_MMA=mma == "fp8")
    if mma in ("packed", "f16"):
        consts["PACKED"] = True
    if mma == "f16":
        consts["F16"] = True
    aligned = ("q_ptr", "qe_ptr", "kv_ptr", "w_ptr", "bt_ptr", "out_ptr", "page_stride")
    return sass(fp4_paged_mqa_logits_kernel, sig, consts, 4, 2, aligned)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the counts here")
    ap.add_argument("--only", default="", help="the rows whose name holds this text")
    a = ap.parse_args()
    rows = {"niah fp8 paged logits": fp8_kernel}
    rows["fp4 unpack, fp4 query"] = lambda: fp4_kernel(True, "unpack")
    rows["fp4 unpack, bf16 query"] = lambda: fp4_kernel(False, "unpack")
    rows["fp4 fp8 MMA, fp4 query"] = lambda: fp4_kernel(True, "fp8")
    rows["fp4 unpack packed, fp4 query"] = lambda: fp4_kernel(True, "packed")
    rows["fp4 unpack packed, bf16 query"] = lambda: fp4_kernel(False, "packed")
    rows["fp4 unpack packed f16, fp4 query"] = lambda: fp4_kernel(True, "f16")
    out = {}
    for name, make in ((n, m) for n, m in rows.items() if a.only in n):
        c = out[name] = count(make())
        print(f"{name}: {c['instructions']} instructions a page loop ({c['a key (4 warps / 64 keys)']} a key); "
              f"{c['by class']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"arch": f"sm_{ARCH}a", "triton": triton.__version__, "kernels": out}, f, indent=1)


if __name__ == "__main__":
    main()
