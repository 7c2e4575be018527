"""Run in a subprocess with TRITON_INTERPRET=1 (see test_sglang_kernels.py): the plugin's
replacement functions driving niah's real Triton kernels on CPU, against SGLang 0.5.23's
own torch fallback (lifted from the wheel) and niah's references. Prints JSON."""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from niah.kernels._common import calc_diff
from niah.kernels.quant import quantize_fp8
from niah.serving.sglang import bf16_cache, replacements
from sglang_source import load_function, sglang_wheel


def _fp8_pages(keys: torch.Tensor) -> torch.Tensor:
    """keys [P, 64, 128] -> SGLang's fp8 page layout, uint8 [P, 64, 1, 132]."""
    k8, s = quantize_fp8(keys)
    p = keys.shape[0]
    row = torch.cat([k8.view(torch.uint8).reshape(p, 64 * 128), s.contiguous().view(torch.uint8).reshape(p, 64 * 4)], 1)
    return row.view(p, 64, 1, 132)


def main() -> None:
    g = torch.Generator().manual_seed(1)
    out = {}
    pages, heads, b = 5, 16, 2
    keys = torch.randn(pages, 64, 128, generator=g)
    table = torch.tensor([[4, 0, 2], [1, 3, 0]], dtype=torch.int32)
    lens = torch.tensor([150, 97], dtype=torch.int32)
    max_len = table.shape[1] * 64
    q = (torch.randn(b, 1, heads, 128, generator=g) / 2).to(torch.float8_e4m3fn)
    w = torch.rand(b, heads, generator=g)
    valid = torch.arange(max_len)[None] < lens[:, None]

    # fp8: SGLang's fp8_paged_mqa_logits_torch (V4's fallback, the function niah replaces)
    ns = {"torch": torch, "F": F, "FP8_DTYPE": torch.float8_e4m3fn, "_arange_cache": {}, "Any": object}
    sglang_torch = load_function(sglang_wheel(), "sglang.srt.layers.attention.dsv4.indexer",
                                 "fp8_paged_mqa_logits_torch", ns)
    kv8 = _fp8_pages(keys)
    want = sglang_torch(q, kv8, w, lens, table, None, max_len, False)
    got = replacements.v4_paged_mqa_logits(q, kv8, w, lens, table, None, max_len, False)
    # the same through the DSA resolver, with SGLang's [B, 1] context lengths
    got2 = replacements.resolve_fp8_paged_mqa_logits_fn()(q, kv8, w, lens.view(-1, 1), table, None, max_len,
                                                          clean_logits=False)
    out["fp8_vs_sglang_torch"] = calc_diff(got.masked_fill(~valid, 0), want.masked_fill(~valid, 0))
    out["fp8_resolver_equal"] = bool(torch.equal(got[valid], got2[valid]))

    # bf16: keys stored unquantised through the plugin's store, read by bf16_paged_mqa_logits
    buf = torch.zeros(pages, 64 * 256, dtype=torch.uint8)
    slots = torch.arange(pages * 64)
    replacements.store_bf16_keys(buf, slots, keys.reshape(-1, 128))
    kv16 = bf16_cache.pages_view(buf)
    got16 = replacements.resolve_fp8_paged_mqa_logits_fn()(q, kv16, w, lens.view(-1, 1), table, None, max_len)
    ref16 = torch.zeros(b, max_len, dtype=torch.float64)
    for i in range(b):
        k = kv16[table[i].long()].reshape(-1, 128).double()
        ref16[i] = (torch.relu(q[i, 0].double() @ k.T) * w[i].double()[:, None]).sum(0)
    out["bf16_paged_vs_exact"] = calc_diff(got16.masked_fill(~valid, 0).double(), ref16.masked_fill(~valid, 0))
    # and bf16 keys score closer to the unquantised keys than fp8 keys do
    exact = torch.zeros(b, max_len, dtype=torch.float64)
    for i in range(b):
        k = keys[table[i].long()].reshape(-1, 128).double()
        exact[i] = (torch.relu(q[i, 0].double() @ k.T) * w[i].double()[:, None]).sum(0)
    e = exact.masked_fill(~valid, 0)
    out["bf16_err"] = calc_diff(got16.masked_fill(~valid, 0).double(), e)
    out["fp8_err"] = calc_diff(got.masked_fill(~valid, 0).double(), e)

    # prefill: bf16 keys gathered + packed for SGLang's fp8 plumbing -> bf16_mqa_logits
    gathered = bf16_cache.gather_keys_torch(buf, table, lens, int(lens.sum()))
    k_u8, s_u8 = bf16_cache.smuggle_as_fp8(gathered)
    kv = (k_u8.view(torch.float8_e4m3fn), s_u8.view(torch.float32).squeeze(-1))
    s_q = 6
    qp = (torch.randn(s_q, heads, 128, generator=g) / 2).to(torch.float8_e4m3fn)
    wp = torch.rand(s_q, heads, generator=g)
    ks = torch.tensor([0, 0, 0, 150, 150, 150], dtype=torch.int32)
    ke = torch.tensor([148, 149, 150, 245, 246, 247], dtype=torch.int32)
    lp = replacements.resolve_fp8_mqa_logits_fn()(qp, kv, wp, ks, ke, clean_logits=False)
    refp = (torch.relu(torch.einsum("shd,nd->shn", qp.double(), gathered.double())) * wp.double()[:, :, None]).sum(1)
    pos = torch.arange(gathered.shape[0])
    vp = (pos[None] >= ks[:, None]) & (pos[None] < ke[:, None])
    out["bf16_prefill_vs_exact"] = calc_diff(lp.masked_fill(~vp, 0).double(), refp.masked_fill(~vp, 0))
    # the bundled store kernel, called as the plugin calls it, vs the torch path (with padding)
    loc = torch.cat([torch.randperm(pages * 64, generator=g)[:40], torch.tensor([-1, -1])])
    new_keys = torch.randn(42, 128, generator=g)
    by_kernel, by_torch = buf.clone(), buf.clone()
    replacements.store_bf16_keys(by_kernel, loc, new_keys, use_kernel=True)
    replacements.store_bf16_keys(by_torch, loc, new_keys, use_kernel=False)
    out["store_kernel_equals_torch"] = bool(torch.equal(by_kernel, by_torch))
    out["store_kernel_changed_buffer"] = not torch.equal(by_kernel, buf)
    out.update(topk_vs_sglang(g))
    json.dump(out, sys.stdout)


def topk_vs_sglang(g: torch.Generator) -> dict:
    """The plugin's top-k (niah.kernels.topk_indices) against SGLang 0.5.23's own unfused
    torch top-k (`_topk_unfused`, lifted from the wheel): same selections, same -1s."""
    from typing import Callable, Dict, Optional, Tuple

    ns = {"torch": torch, "Optional": Optional, "Callable": Callable, "Dict": Dict, "Tuple": Tuple}
    sglang_topk = load_function(sglang_wheel(), "sglang.srt.layers.attention.dsa.dsa_topk_backend",
                                "_topk_unfused", ns)
    rows, width, k = 6, 300, 32
    score = torch.randn(rows, width, generator=g)
    score[2, 5] = float("-inf")  # a masked position inside a row's window
    lengths = torch.tensor([300, 10, 100, 32, 0, 250], dtype=torch.int32)
    starts = torch.tensor([0, 5, 7, 100, 3, 20], dtype=torch.int32)
    lengths_s = torch.minimum(lengths, width - starts)
    same = []
    for st, ln in ((None, lengths), (starts, lengths_s)):
        want = sglang_topk(score, ln, k, row_starts=st)
        got = replacements.niah_topk(score, ln, k, row_starts=st)
        same.append(got.shape == want.shape and all(
            sorted(got[r].tolist()) == sorted(want[r].tolist()) for r in range(rows)))
    return {"topk_equal_sglang": same[0], "topk_equal_sglang_row_starts": same[1]}


if __name__ == "__main__":
    main()
