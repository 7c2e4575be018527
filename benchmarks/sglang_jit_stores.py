"""The key-store and query checks of sglang_jit_evidence.py: niah's V3.2 and V4 index-key stores
against SGLang 0.5.23's JIT kernels on identical inputs (bytes, bf16 ulps, e4m3 steps, rounding
bounds), SGLang's fused fp8 query against the bf16 query, and eager / CUDA-graph timings.
Layouts: SGLang's index-K page (page_size P): P*128 fp8 bytes then P fp32 scales; niah's bf16
page: P rows of 256 bytes.
"""

from __future__ import annotations

import torch

import sglang_jit_selection as sel
from sglang_jit_ops import Ops, quant_rows, rope_first

PAGE, DIM = sel.PAGE, sel.DIM


def ordinal(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Sign-magnitude codes (e4m3 bytes, bf16 words) as integers ordered like their values."""
    c = codes.to(torch.int64) & ((1 << bits) - 1)
    sign, mag = c >> (bits - 1), c & ((1 << (bits - 1)) - 1)
    return torch.where(sign == 1, -mag, mag)


def steps(a: torch.Tensor, b: torch.Tensor, bits: int) -> torch.Tensor:
    """How many representable values apart two tensors of codes are (e4m3: bits 8, bf16: 16)."""
    return (ordinal(a, bits) - ordinal(b, bits)).abs()


def e4m3_half_step(y: torch.Tensor) -> torch.Tensor:
    """Half the e4m3 spacing at |y| (normal: 2^(e-3), subnormal below 2^-6: 2^-9)."""
    e = torch.floor(torch.log2(y.abs().clamp_min(2.0**-6)))
    return 0.5 * torch.exp2(e - 3)


def page_rows(cache: torch.Tensor, loc: torch.Tensor, row_bytes: int, page: int = PAGE):
    """(values [N, row_bytes] uint8, fp32 scales [N] or None) of SGLang-layout pages at slots loc."""
    pg, off = loc.long() // page, loc.long() % page
    base = pg * cache.shape[1]
    ar = torch.arange(row_bytes, device=cache.device)
    vals = cache.view(-1)[(base + off * row_bytes)[:, None] + ar]
    if row_bytes != DIM:
        return vals, None
    sc = cache.view(-1)[(base + page * DIM + off * 4)[:, None] + torch.arange(4, device=cache.device)]
    return vals, sc.contiguous().view(torch.float32).flatten()


def fp8_agreement(got: torch.Tensor, want: torch.Tensor, loc: torch.Tensor) -> dict:
    """Two fp8 index caches (SGLang's page layout): whole-buffer and per-field agreement."""
    gv, gs = page_rows(got, loc, DIM)
    wv, ws = page_rows(want, loc, DIM)
    st = steps(gv, wv, 8)
    return {"buffer_bytes_equal_fraction": float((got == want).double().mean()),
            "value_bytes_equal_fraction": float((gv == wv).double().mean()),
            "max_e4m3_steps": int(st.max()), "scales_equal_fraction": float((gs == ws).double().mean()),
            "scales_max_fp32_ulps": int((gs.view(torch.int32).long() - ws.view(torch.int32).long()).abs().max()),
            "untouched_bytes_equal": bool(torch.equal(outside(got, loc, 132), outside(want, loc, 132)))}


def outside(cache: torch.Tensor, loc: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """The bytes of every page slot not in loc (must keep their poison)."""
    keep = torch.ones(cache.shape[0] * PAGE, dtype=torch.bool, device=cache.device)
    keep[loc.long()] = False
    vals, sc = page_rows(cache, keep.nonzero().flatten(), DIM if row_bytes == 132 else row_bytes)
    return vals.flatten() if sc is None else torch.cat((vals.flatten(), sc.view(torch.uint8)))


def niah_v32_store():
    from niah import kernels

    return getattr(kernels, "store_v32_index_keys", None)


def v32_inputs(n: int, device: str, seed: int = 11):
    g = torch.Generator().manual_seed(seed)
    key_raw = sel.make_keys(n, g).to(device)
    w, b = (t.to(device) for t in sel.make_norm(g))
    pages = n // PAGE + 4
    loc = torch.randperm(pages * PAGE, generator=g)[:n].to(device)
    pos = torch.randint(0, 8192, (n,), generator=g).to(device)
    poison = torch.randint(0, 256, (pages, 256 * PAGE), dtype=torch.uint8, generator=g).to(device)
    return key_raw, w, b, loc, pos, sel.cos_sin_cache(8192, device), poison


def v32_store(ops: Ops, n: int, device: str, res) -> None:
    key_raw, w, b, loc, pos, cs, poison = v32_inputs(n, device)
    pre = ops.k_norm_rope(key_raw, w, b, sel.EPS, cs, pos)
    sgl8 = poison[:, : 132 * PAGE].contiguous()
    ops.k_norm_rope_store(key_raw, sgl8, loc, w, b, sel.EPS, cs, pos, PAGE)
    vals, scale = page_rows(sgl8, loc, DIM)
    deq = vals.view(torch.float8_e4m3fn).double() * scale.double()[:, None]
    y = pre.double() / scale.double()[:, None]
    within = (deq - pre.double()).abs() <= e4m3_half_step(y) * scale.double()[:, None] * (1 + 1e-6)
    m8, mscale = quant_rows(pre.float())
    out = {"tokens": n, "sglang_fp8": {
        "dequantised_within_half_e4m3_step_of_prequant_fraction": float(within.double().mean()),
        "equal_to_torch_quantisation_of_prequant_bytes_fraction": float((vals == m8.view(torch.uint8)).double().mean()),
        "max_e4m3_steps_vs_torch_quantisation": int(steps(vals, m8.view(torch.uint8), 8).max()),
        "scale_equals_amax_over_448_fraction": float((scale == mscale).double().mean())}}
    res.check("v32: SGLang's fp8 rows, dequantised, within half an e4m3 step of its pre-quantisation values",
              bool(within.all()))
    store = niah_v32_store()
    if store is None:
        out["niah"] = "niah.kernels has no store_v32_index_keys: not compared"
        res.put("v32_store", out)
        res.check("v32: niah's V3.2 store exists", False)
        return
    n16 = poison.clone()
    store(key_raw, n16, loc, w, b, sel.EPS, cs, pos, page_size=PAGE, index_dtype="bf16")
    rows, _ = page_rows(n16, loc, 256)
    ulps = steps(rows.view(torch.int16), pre.view(torch.int16), 16)
    n8 = poison[:, : 132 * PAGE].contiguous()
    store(key_raw, n8, loc, w, b, sel.EPS, cs, pos, page_size=PAGE, index_dtype="fp8")
    out["niah_bf16_vs_sglang_prequant"] = {
        "equal_fraction": float((ulps == 0).double().mean()), "one_ulp_fraction": float((ulps == 1).double().mean()),
        "max_ulps": int(ulps.max()),
        "max_abs_diff": float((rows.view(torch.bfloat16).float() - pre.float()).abs().max()),
        "untouched_rows_keep_poison": bool(torch.equal(outside(n16, loc, 256), outside(poison, loc, 256)))}
    out["niah_fp8_vs_sglang_fp8"] = fp8_agreement(n8, sgl8, loc)
    res.put("v32_store", out)
    a, f = out["niah_bf16_vs_sglang_prequant"], out["niah_fp8_vs_sglang_fp8"]
    res.check("v32: niah's bf16 rows equal SGLang's pre-quantisation values (<= 1 bf16 ulp), other rows untouched",
              a["max_ulps"] <= 1 and a["untouched_rows_keep_poison"])
    res.check("v32: niah's fp8 rows byte-equal SGLang's or one e4m3 step, scales equal, other bytes untouched",
              f["max_e4m3_steps"] <= 1 and f["scales_equal_fraction"] == 1.0 and f["untouched_bytes_equal"])


def v32_query(ops: Ops, rows: int, device: str, res) -> None:
    g = torch.Generator().manual_seed(12)
    q = torch.randn(rows, sel.HEADS, DIM, generator=g).bfloat16().to(device)
    wr = torch.randn(rows, DIM + sel.HEADS, generator=g).bfloat16()[:, DIM:].to(device)
    pos = torch.randint(0, 8192, (rows,), generator=g).to(device)
    cs = sel.cos_sin_cache(8192, device)
    q8, w8 = ops.q_rope_quant(q, wr, sel.GATE, cs, pos)
    x = rope_first(q.float(), cs, pos)
    m8, ms = quant_rows(x)
    scale = w8.squeeze(-1).double() / (wr.double() * sel.GATE)
    deq = q8.double() * scale[..., None]
    x16 = x.bfloat16().double()
    tol = e4m3_half_step(x16 / scale[..., None]) * scale[..., None] + x16.abs() * 2.0**-8
    out = {"rows": rows, "heads": sel.HEADS,
           "bytes_equal_torch_rope_then_quant_fraction": float((q8.view(torch.uint8) == m8.view(torch.uint8))
                                                                .double().mean()),
           "max_e4m3_steps": int(steps(q8.view(torch.uint8), m8.view(torch.uint8), 8).max()),
           "gate_times_scale_rel_err": float(((scale - ms.double()) / ms.double()).abs().max()),
           "dequantised_within_fp8_rounding_of_bf16_query_fraction": float(((deq - x16).abs() <= tol).double().mean())}
    res.put("v32_query", out)
    res.check("v32: SGLang's fp8 query is the fp8 rounding of the RoPE'd query niah's bf16 arm uses",
              out["max_e4m3_steps"] <= 1 and out["gate_times_scale_rel_err"] < 1e-5)


def v4_inputs(n: int, device: str, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    kv = sel.make_keys(n, g).contiguous()
    weight = (1 + 0.2 * torch.randn(DIM, generator=g)).bfloat16()
    ang = torch.arange(4 * n + 8, dtype=torch.float64)[:, None] / (
        10000 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))[None, :]
    freqs = torch.polar(torch.ones_like(ang), ang).to(torch.complex64)  # SGLang's freqs_cis
    pages = -(-n // PAGE) + 3
    table = torch.randperm(pages, generator=g)[: pages - 3]
    i = torch.arange(n)
    slots = table[i // PAGE] * PAGE + i % PAGE
    poison = torch.randint(0, 256, (pages, 256 * PAGE), dtype=torch.uint8, generator=g)
    return [t.to(device) for t in (kv, weight, freqs, slots, poison)]


def v4_store(ops: Ops, n: int, device: str, res) -> None:
    from niah.kernels import store_v4_index_keys

    kv, weight, freqs, slots, poison = v4_inputs(n, device)
    freqs_real = torch.view_as_real(freqs).flatten(-2)
    out = {"compressed_tokens": n, "note": "SGLang has no pre-quantisation output for the 128-wide indexer "
           "(fused_norm_rope_v2.cuh static_asserts kBf16Store off for it): niah's bf16 rows are compared "
           "with SGLang's fp8 rows dequantised"}
    for mode in ("prefill", "decode"):
        words = torch.zeros(n, 4, dtype=torch.int32)
        skip = (torch.arange(n) % 3 == 0) if mode == "decode" else torch.zeros(n, dtype=torch.bool)
        words[:, 0] = 4 * (torch.arange(n, dtype=torch.int32) + 1) + skip.int()  # decode: seq_len % 4 != 0: no write
        words[:, 1] = torch.arange(n, dtype=torch.int32)  # ragged_id (uint16)
        plan = words.view(torch.uint8).reshape(n, 16).to(device)
        sgl_plan = (ops.DecodePlan(4, plan) if mode == "decode"
                    else ops.PrefillPlan(4, plan, torch.zeros(n, 8, dtype=torch.uint8, device=device)))
        sgl8, n8, n16 = poison[:, : 132 * PAGE].contiguous(), poison[:, : 132 * PAGE].contiguous(), poison.clone()
        ops.v4_store(kv, sgl_plan, norm_weight=weight, norm_eps=sel.EPS, freq_cis=freqs, out_loc=slots,
                     kvcache=sgl8, page_size=PAGE)
        for cache, dt in ((n8, "fp8"), (n16, "bf16")):
            store_v4_index_keys(kv, plan, mode == "decode", 4, weight, sel.EPS, freqs_real, slots, cache, dt, PAGE)
        wloc = slots[~skip.to(device)]
        vals, scale = page_rows(sgl8, wloc, DIM)
        deq = vals.view(torch.float8_e4m3fn).double() * scale.double()[:, None]
        r16 = page_rows(n16, wloc, 256)[0].view(torch.bfloat16).double()
        tol = e4m3_half_step(r16 / scale.double()[:, None]) * scale.double()[:, None] + r16.abs() * 2.0**-8
        out[mode] = {"written": int(wloc.numel()), "niah_fp8_vs_sglang_fp8": fp8_agreement(n8, sgl8, wloc),
                     "niah_bf16_within_fp8_rounding_of_sglang_fp8_fraction": float(((r16 - deq).abs() <= tol)
                                                                                  .double().mean()),
                     "niah_bf16_within_fp8_rounding_of_sglang_fp8_all": bool(((r16 - deq).abs() <= tol).all()),
                     "niah_bf16_untouched_rows_keep_poison": bool(torch.equal(outside(n16, wloc, 256),
                                                                              outside(poison, wloc, 256)))}
        f, o = out[mode]["niah_fp8_vs_sglang_fp8"], out[mode]
        # V4's pre-quantisation values (RMSNorm, RoPE, 128-wide Hadamard) are summed in another order
        # by niah's Triton kernel than by SGLang's warp kernel: a token's amax, and so its fp32
        # scale, can differ in the last bits; the check bounds that (and the value bytes) instead
        # of asking for equal scales.
        res.check(f"v4 {mode}: niah's fp8 rows byte-equal SGLang's fused_norm_rope_v2 or one e4m3 step, "
                  "scales within 8 fp32 ulps, skipped/other slots untouched",
                  f["max_e4m3_steps"] <= 1 and f["scales_max_fp32_ulps"] <= 8 and f["untouched_bytes_equal"])
        res.check(f"v4 {mode}: niah's bf16 rows within fp8 rounding of SGLang's dequantised fp8, others untouched",
                  o["niah_bf16_within_fp8_rounding_of_sglang_fp8_all"] and o["niah_bf16_untouched_rows_keep_poison"])
    res.put("v4_store", out)


def time_us(fn, reps: int = 20, iters: int = 50) -> dict:
    """Per-launch microseconds: eager (back to back, CUDA events) and CUDA-graph replay."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    z.record()
    torch.cuda.synchronize()
    out = {"eager_us": a.elapsed_time(z) * 1e3 / iters}
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        g.replay()
        torch.cuda.synchronize()
        a.record()
        for _ in range(5):
            g.replay()
        z.record()
        torch.cuda.synchronize()
        out["graph_replay_us"] = a.elapsed_time(z) * 1e3 / (5 * reps)
    except Exception as e:  # noqa: BLE001 - a capture failure is a finding, not a crash
        out["graph_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def timing(ops: Ops, n: int, device: str, res) -> None:
    key_raw, w, b, loc, pos, cs, poison = v32_inputs(n, device)
    c8, c16 = poison[:, : 132 * PAGE].contiguous(), poison.clone()
    cases = {"sglang fused_k_indexer_norm_rope_store (fp8 page)":
             lambda: ops.k_norm_rope_store(key_raw, c8, loc, w, b, sel.EPS, cs, pos, PAGE),
             "sglang fused_k_indexer_norm_rope (bf16 out, no store)":
             lambda: ops.k_norm_rope(key_raw, w, b, sel.EPS, cs, pos)}
    store = niah_v32_store()
    if store is not None:
        for dt, cache in (("bf16", c16), ("fp8", c8)):
            cases[f"niah store_v32_index_keys ({dt})"] = (
                lambda dt=dt, cache=cache: store(key_raw, cache, loc, w, b, sel.EPS, cs, pos, page_size=PAGE,
                                                 index_dtype=dt))
    out = {"tokens": n}
    for name, fn in cases.items():
        try:
            out[name] = time_us(fn)
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    res.put("timing_v32_key_store", out)
