"""The GPU server's decode-step kernels and its prefill's score and select kernels compile for sm_90 here, without a GPU
(tests/kernels/compile_sm90.py in a process of its own: the interpreter this folder's other
tests run under accepts code the compiler refuses: a first GPU run once failed on a top-k
search whose statements after a `return` in a constexpr branch the compiler still built, past
Triton's largest tensor)."""

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("compile_sm90.py")


def test_the_decode_step_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    done = re.search(r"^(\d+) of (\d+) compiled for sm_90$", run.stdout, re.M)
    assert done and done.group(1) == done.group(2) == "31", run.stdout[-500:]
    for kernel in ("sparse_attention_kernel", "union_attention_kernel", "tile_union_kernel",
                   "tile_union_bitmap_kernel", "topk_kernel", "quantize_query_kernel", "indexer_logits_pages_kernel",
                   "sample_topk_kernel"):
        assert f"OK {kernel} " in run.stdout, kernel
