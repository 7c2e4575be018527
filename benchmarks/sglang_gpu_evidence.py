"""GPU evidence for niah's SGLang plugin with SGLang 0.5.23's own indexer code.

SGLang functions are lifted from its source (a wheel or a folder holding the few modules
below), compiled from the real text, and run on CUDA tensors beside the plugin's
replacements (niah.serving.sglang.replacements, which call niah.kernels):

- key store: bf16 keys through the plugin's store into SGLang's own IndexKeyCache (lifted
  class, the plugin's bf16 methods); fp8 keys quantised as SGLang's act_quant does
  (niah.kernels.quant) into the 132-byte rows of the stock IndexKeyCache;
- prefill logits: bf16 via the plugin's get_k_and_scale gather + mqa_logits; fp8/niah via
  mqa_logits; fp8/stock via SGLang's `_fp8_mqa_logits_torch`;
- decode logits, next_n 1 and 2: the plugin's paged_mqa_logits (bf16, fp8/niah); fp8/stock
  via SGLang's `fp8_paged_mqa_logits_torch` (next_n 1: SGLang's torch path refuses 2);
- top-k: the plugin's top-k (niah.kernels.topk_indices) vs SGLang's `_topk_unfused`;
- decode (logits + top-k) captured in a CUDA graph and replayed on new queries;
- everything against a float64 indexer on the unquantised keys: calc_diff of the logits
  and the top-k overlap with the float64 selection, per arm, on identical inputs.

    python benchmarks/sglang_gpu_evidence.py --sglang-src SGLANG_WHEEL_OR_DIR --out DIR
    TRITON_INTERPRET=1 python benchmarks/sglang_gpu_evidence.py --smoke ...   # CPU, tiny
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import platform
import sys
import textwrap
import time
import types
import zipfile
from pathlib import Path

import torch
import torch.nn.functional as F

MODULES = {  # what is lifted, from where
    "index_key_cache": ("sglang.srt.mem_cache.index_key_cache", "IndexKeyCache"),
    "paged_torch": ("sglang.srt.layers.attention.dsv4.indexer", "fp8_paged_mqa_logits_torch"),
    "prefill_torch": ("sglang.srt.layers.attention.dsa.utils", "_fp8_mqa_logits_torch"),
    "topk_unfused": ("sglang.srt.layers.attention.dsa.dsa_topk_backend", "_topk_unfused"),
}


def read_module(src: Path, module: str) -> str:
    rel = module.replace(".", "/") + ".py"
    if src.is_dir():
        return (src / rel).read_text()
    with zipfile.ZipFile(src) as z:
        return z.read(rel).decode()


def lift(src: Path, module: str, name: str, ns: dict):
    """Compile SGLang's top-level `name` from its real source into `ns`."""
    import __future__

    text = read_module(src, module)
    node = next(n for n in ast.parse(text).body
                if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name)
    node.decorator_list = []
    code = compile(textwrap.dedent(ast.unparse(node)), f"<sglang {module}.{name}>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, ns)
    return ns[name]


def sglang_parts(src: Path) -> dict:
    from typing import Any, Callable, Dict, Optional, Tuple

    base = {"torch": torch, "F": F, "Any": Any, "Optional": Optional, "Callable": Callable,
            "Dict": Dict, "Tuple": Tuple}
    parts = {}
    ikc_ns = {**base, "nullcontext": contextlib.nullcontext, "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache",
              "dsa_index_k_cache": None, "_use_aiter_preshuffle": False, "INDEXER_K_CACHE_PRESHUFFLE_TILE": 16}
    parts["index_key_cache"] = lift(src, *MODULES["index_key_cache"], ikc_ns)
    parts["paged_torch"] = lift(src, *MODULES["paged_torch"], {**base, "FP8_DTYPE": torch.float8_e4m3fn,
                                                                "_arange_cache": {}})
    parts["prefill_torch"] = lift(src, *MODULES["prefill_torch"], dict(base))
    parts["topk_unfused"] = lift(src, *MODULES["topk_unfused"], dict(base))
    return parts


def patched(cls, when: str):
    """SGLang's class with the plugin's IndexKeyCache patches for one arm applied."""
    from niah.serving.sglang.plugin import all_patches

    out = type(f"{cls.__name__}_{when}", (cls,), {})
    for p in all_patches():
        if p.target.startswith("sglang.srt.mem_cache.index_key_cache.IndexKeyCache.") and p.when == when:
            name = p.target.rsplit(".", 1)[1]
            setattr(out, name, p.factory(getattr(cls, name)))
    return out


def pool(device, pages: int):
    return types.SimpleNamespace(
        page_size=64, index_kpool=1, index_page_size=64, index_head_dim=128, quant_block_size=128,
        index_k_with_scale_buffer_dtype=torch.uint8, device=device, layer_num=1, skip_topk_layers=[False],
        start_layer=0, layer_transfer_counter=None, custom_mem_pool=None,
        memory_saver_adapter=types.SimpleNamespace(region=lambda _tag: contextlib.nullcontext()))


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denom) if denom > 0 else 0.0


# ---------------------------------------------------------------------------------------


class Setup:
    """Identical inputs for every arm: keys with outlier channels (as real index keys have),
    fp8 queries (SGLang quantises the index query), per-head weights, paged requests."""

    def __init__(self, lens: list[int], heads: int, device, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.device, self.heads, self.lens = device, heads, lens
        pages_per = [-(-n // 64) for n in lens]
        self.max_pages = max(pages_per)
        self.n_pages = sum(pages_per) + 1
        keys = torch.randn(self.n_pages * 64, 128, generator=g)
        keys[:, :4] *= 12.0  # a few large channels: per-token fp8 scales get coarse
        self.keys = keys.to(device)
        perm = torch.randperm(self.n_pages, generator=g)
        table = torch.zeros(len(lens), self.max_pages, dtype=torch.int32)
        at = 0
        for b, n in enumerate(pages_per):
            table[b, :n] = perm[at:at + n]
            at += n
        self.table = table.to(device)
        self.ctx = torch.tensor(lens, dtype=torch.int32, device=device)
        self.g = g

    def queries(self, next_n: int):
        b = len(self.lens)
        q = (torch.randn(b, next_n, self.heads, 128, generator=self.g) / 2).to(torch.float8_e4m3fn)
        w = torch.rand(b * next_n, self.heads, generator=self.g) / self.heads
        return q.to(self.device), w.to(self.device)

    def token_keys(self, b: int, keys: torch.Tensor) -> torch.Tensor:
        """Request b's keys in order, [len, 128], from a [slots, 128] tensor."""
        pages = self.table[b, :-(-self.lens[b] // 64)].long()
        return keys.view(-1, 64, 128)[pages].reshape(-1, 128)[: self.lens[b]]


def fp64_decode(s: Setup, q, w, keys: torch.Tensor, next_n: int) -> torch.Tensor:
    """float64 indexer: [B*next_n, max_pages*64], -inf where not visible."""
    width = s.max_pages * 64
    out = torch.full((len(s.lens) * next_n, width), float("-inf"), dtype=torch.float64, device=s.device)
    for b, n in enumerate(s.lens):
        k = s.token_keys(b, keys).double()
        for j in range(next_n):
            visible = n - next_n + j + 1
            r = b * next_n + j
            sc = (torch.relu(q[b, j].double() @ k[:visible].T) * w[r].double()[:, None]).sum(0)
            out[r, :visible] = sc
    return out


def logits_check(got: torch.Tensor, ref: torch.Tensor) -> float:
    valid = torch.isfinite(ref)
    return calc_diff(got.double().masked_fill(~valid, 0), ref.masked_fill(~valid, 0))


def overlap(sel: torch.Tensor, ref_sel: torch.Tensor) -> float:
    """Mean over rows of |sel ∩ ref| / |ref| (valid entries only)."""
    tot = []
    for a, b in zip(sel.tolist(), ref_sel.tolist()):
        ref = {x for x in b if x >= 0}
        if ref:
            tot.append(len({x for x in a if x >= 0} & ref) / len(ref))
    return sum(tot) / len(tot)


def fp8_rows(keys: torch.Tensor, n_pages: int) -> torch.Tensor:
    """SGLang's fp8 page rows, uint8 [pages, 64*132]: keys then one fp32 scale per token
    (quantised as act_quant does: amax/448 per token, e4m3)."""
    from niah.kernels.quant import quantize_fp8

    k8, sc = quantize_fp8(keys.view(n_pages, 64, 128))
    return torch.cat([k8.view(torch.uint8).reshape(n_pages, -1),
                      sc.contiguous().view(torch.uint8).reshape(n_pages, -1)], 1)


def time_ms(fn, iters: int) -> float | None:
    if not torch.cuda.is_available():
        return None
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


class Results:
    """Collects results and writes them after every section (a killed run keeps them)."""

    def __init__(self, out: Path | None, meta: dict):
        self.out, self.data = out, {"meta": meta, "checks": {}}

    def put(self, section: str, value) -> None:
        self.data[section] = value
        print(f"[{section}] {json.dumps(value)}", flush=True)
        self.flush()

    def check(self, name: str, ok: bool) -> None:
        self.data["checks"][name] = bool(ok)
        print(f"  check {name}: {'PASS' if ok else 'FAIL'}", flush=True)
        self.flush()

    def flush(self) -> None:
        if self.out:
            (self.out / "results.json").write_text(json.dumps(self.data, indent=1) + "\n")


def stores(s: Setup, parts: dict, res: Results):
    from niah.serving.sglang import attest, bf16_cache, replacements

    size = s.n_pages * 64 - 65  # SGLang: pages = (size + 65) // 64
    attest.reset()
    attest.configure("bf16", "niah")
    cache16 = patched(parts["index_key_cache"], "bf16")(pool(s.device, s.n_pages), size)
    bytes16 = attest.snapshot()["pool_bytes_per_token"]
    slots = torch.arange(s.n_pages * 64, device=s.device)
    replacements.store_bf16_keys(cache16.buffer[0], slots, s.keys)  # CUDA: niah's store kernel
    kv16 = bf16_cache.pages_view(cache16.buffer[0])
    store_exact = torch.equal(kv16.reshape(-1, 128), s.keys.to(torch.bfloat16))
    stored16 = attest.snapshot()["counts"].get("store.bf16", 0)
    attest.reset()
    attest.configure("fp8", "stock")
    cache8 = patched(parts["index_key_cache"], "fp8")(pool(s.device, s.n_pages), size)
    bytes8 = attest.snapshot()["pool_bytes_per_token"]
    cache8.buffer[0].copy_(fp8_rows(s.keys, s.n_pages))
    kv8 = cache8.buffer[0].view(s.n_pages, 64, 1, 132)
    res.put("store", {"bf16_row_bytes": cache16.buffer[0].shape[1], "fp8_row_bytes": cache8.buffer[0].shape[1],
                      "attested_pool_bytes_per_token": {"bf16": bytes16, "fp8": bytes8},
                      "bf16_store_bit_exact": store_exact, "bf16_store_calls_attested": stored16,
                      "store_kernel_used": bool(s.keys.is_cuda)})
    res.check("bf16 store bit-exact through the plugin into SGLang's IndexKeyCache", store_exact)
    res.check("pool bytes/token attested 256 (bf16) and 132 (fp8)", (bytes16, bytes8) == (256, 132))
    return cache16, kv16, kv8


def dequant_keys(kv8: torch.Tensor) -> torch.Tensor:
    p = kv8.shape[0]
    rows = kv8.view(p, 64 * 132)
    k8 = rows[:, :64 * 128].contiguous().view(torch.float8_e4m3fn).view(p, 64, 128).float()
    sc = rows[:, 64 * 128:].contiguous().view(torch.float32).view(p, 64, 1)
    return (k8 * sc).reshape(-1, 128)


def select(logits: torch.Tensor, lengths: torch.Tensor, k: int, starts=None) -> torch.Tensor:
    from niah.serving.sglang import replacements

    return replacements.niah_topk(logits.float(), lengths, k, starts)


def ref_select(ref: torch.Tensor, k: int) -> torch.Tensor:
    kk = min(k, ref.shape[1])
    vals, idx = torch.topk(ref, kk, dim=1)
    return idx.masked_fill(torch.isinf(vals), -1)


def decode(s: Setup, parts: dict, kv16, kv8, ks: list[int], res: Results) -> None:
    from niah.serving.sglang import replacements

    width = s.max_pages * 64
    k16 = kv16.reshape(-1, 128).float()
    k8 = dequant_keys(kv8)
    for next_n in (1, 2):
        q, w = s.queries(next_n)
        ctx = torch.stack([s.ctx - next_n + j + 1 for j in range(next_n)], 1).to(torch.int32)  # [B, next_n]
        lens = ctx.reshape(-1)
        ref = fp64_decode(s, q, w, s.keys, next_n)
        arms = {"bf16/niah": replacements.paged_mqa_logits(q, kv16, w, ctx, s.table, None, width),
                "fp8/niah": replacements.paged_mqa_logits(q, kv8, w, ctx, s.table, None, width)}
        exact = {"bf16/niah": fp64_decode(s, q, w, k16, next_n), "fp8/niah": fp64_decode(s, q, w, k8, next_n)}
        if next_n == 1:  # SGLang's torch path takes next_n 1 only
            arms["fp8/stock-torch"] = parts["paged_torch"](q, kv8, w, s.ctx, s.table, None, width, False)
            exact["fp8/stock-torch"] = exact["fp8/niah"]
        out = {}
        for arm, got in arms.items():
            row = {"vs_own_keys_fp64": logits_check(got, exact[arm]), "vs_unquantised_fp64": logits_check(got, ref)}
            for k in ks:
                sel = select(got, lens, k)
                row[f"topk{k}_overlap_vs_fp64"] = overlap(sel, ref_select(ref, k))
                want = parts["topk_unfused"](got.float().contiguous(), lens, k)
                row[f"topk{k}_same_as_sglang_unfused"] = all(
                    set(a) == set(b) for a, b in zip(sel.tolist(), want.tolist()))
            out[arm] = row
        res.put(f"decode_next_n{next_n}", out)
        res.check(f"decode next_n={next_n}: bf16 keys read exactly (< 5e-6)",
                  out["bf16/niah"]["vs_own_keys_fp64"] < 5e-6)
        res.check(f"decode next_n={next_n}: fp8/niah reads fp8 keys exactly (< 5e-6)",
                  out["fp8/niah"]["vs_own_keys_fp64"] < 5e-6)
        res.check(f"decode next_n={next_n}: niah top-k selects what SGLang's unfused top-k selects",
                  all(v for r in out.values() for key, v in r.items() if key.endswith("same_as_sglang_unfused")))
        if next_n == 1:
            res.check("decode: SGLang stock torch fp8 within 1e-3 of its keys",
                      out["fp8/stock-torch"]["vs_own_keys_fp64"] < 1e-3)


def prefill(s: Setup, parts: dict, cache16, kv8, ks: list[int], n_q: int, res: Results) -> None:
    from niah.serving.sglang import replacements

    b = max(range(len(s.lens)), key=lambda i: s.lens[i])
    L = s.lens[b]
    n_q = min(n_q, L)
    g = s.g
    q = (torch.randn(n_q, s.heads, 128, generator=g) / 2).to(torch.float8_e4m3fn).to(s.device)
    w = (torch.rand(n_q, s.heads, generator=g) / s.heads).to(s.device)
    ke = torch.arange(L - n_q + 1, L + 1, dtype=torch.int32, device=s.device)  # causal: query i sees < ke[i]
    kstart = torch.zeros(n_q, dtype=torch.int32, device=s.device)
    k_u8, s_u8 = cache16.get_k_and_scale(0, s.ctx[b:b + 1], s.table[b:b + 1], L, L)  # the plugin's gather
    kv16 = (k_u8.view(torch.float8_e4m3fn), s_u8.view(torch.float32).squeeze(-1))
    rows = kv8.view(-1, 64 * 132)[s.table[b, :-(-L // 64)].long()]
    k8 = rows[:, :64 * 128].contiguous().view(torch.float8_e4m3fn).reshape(-1, 128)[:L]
    sc = rows[:, 64 * 128:].contiguous().view(torch.float32).reshape(-1)[:L]
    keys = s.token_keys(b, s.keys)
    pos = torch.arange(L, device=s.device)
    valid = pos[None] < ke[:, None]

    def ref_of(k):
        r = (torch.relu(torch.einsum("shd,nd->shn", q.double(), k.double())) * w.double()[:, :, None]).sum(1)
        return r.masked_fill(~valid, float("-inf"))

    ref = ref_of(keys)
    arms = {"bf16/niah": replacements.mqa_logits(q, kv16, w, kstart, ke, clean_logits=False),
            "fp8/niah": replacements.mqa_logits(q, (k8, sc), w, kstart, ke, clean_logits=False),
            "fp8/stock-torch": parts["prefill_torch"](q, (k8, sc), w, kstart, ke)}
    exact = {"bf16/niah": ref_of(keys.to(torch.bfloat16)), "fp8/niah": ref_of(k8.float() * sc[:, None])}
    exact["fp8/stock-torch"] = exact["fp8/niah"]
    out = {}
    for arm, got in arms.items():
        got = got.masked_fill(~valid, float("-inf"))
        row = {"vs_own_keys_fp64": logits_check(got, exact[arm]), "vs_unquantised_fp64": logits_check(got, ref)}
        for k in ks:
            row[f"topk{k}_overlap_vs_fp64"] = overlap(select(got, ke - kstart, k, kstart), ref_select(ref, k))
        out[arm] = row
    res.put("prefill", {"queries": n_q, "keys": L, **out})
    res.check("prefill: bf16 keys read exactly (< 5e-6)", out["bf16/niah"]["vs_own_keys_fp64"] < 5e-6)
    res.check("prefill: fp8/niah reads fp8 keys exactly (< 5e-6)", out["fp8/niah"]["vs_own_keys_fp64"] < 5e-6)


def graphs_and_timing(s: Setup, parts: dict, kv16, kv8, k: int, res: Results) -> None:
    """Decode (logits + top-k) captured in a CUDA graph, replayed on new queries; eager
    timings of each arm's decode logits and of the two top-k implementations."""
    from niah.serving.sglang import replacements

    if not torch.cuda.is_available():
        res.put("cuda_graph", "skipped: no CUDA")
        return
    width = s.max_pages * 64
    q, w = s.queries(1)
    out = {}
    for arm, kv in (("bf16/niah", kv16), ("fp8/niah", kv8)):
        static_q = q.clone()

        def step():
            logits = replacements.paged_mqa_logits(static_q, kv, w, s.ctx, s.table, None, width)
            return logits, replacements.niah_topk(logits, s.ctx, k)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            g_logits, g_top = step()
        q2, _ = s.queries(1)
        static_q.copy_(q2)
        graph.replay()
        torch.cuda.synchronize()
        e_logits, e_top = step()
        valid = torch.arange(width, device=s.device)[None] < s.ctx[:, None]
        same_logits = torch.equal(g_logits[valid], e_logits[valid])
        same_top = all(set(a) == set(b) for a, b in zip(g_top.tolist(), e_top.tolist()))
        replay_ms = time_ms(graph.replay, 20)
        out[arm] = {"replay_equals_eager_logits": same_logits, "replay_equals_eager_topk": same_top,
                    "graph_replay_ms": replay_ms}
        res.check(f"CUDA graph replay of {arm} decode equals eager", same_logits and same_top)
    logits = replacements.paged_mqa_logits(q, kv8, w, s.ctx, s.table, None, width)
    out["eager_ms"] = {
        "decode_logits bf16/niah": time_ms(
            lambda: replacements.paged_mqa_logits(q, kv16, w, s.ctx, s.table, None, width), 20),
        "decode_logits fp8/niah": time_ms(
            lambda: replacements.paged_mqa_logits(q, kv8, w, s.ctx, s.table, None, width), 20),
        "decode_logits fp8/stock-torch": time_ms(
            lambda: parts["paged_torch"](q, kv8, w, s.ctx, s.table, None, width, False), 20),
        f"topk{k} niah": time_ms(lambda: replacements.niah_topk(logits, s.ctx, k), 20),
        f"topk{k} sglang torch (_topk_unfused)": time_ms(lambda: parts["topk_unfused"](logits, s.ctx, k), 20),
    }
    res.put("cuda_graph_and_timing", out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sglang-src", type=Path, required=True, help="SGLang 0.5.23 wheel or a folder of its modules")
    p.add_argument("--out", type=Path)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (set TRITON_INTERPRET=1)")
    a = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not a.smoke else "cpu"
    if a.smoke:
        lens, heads, ks, n_q = [150, 97], 16, [16, 64], 6
    else:
        lens, heads, ks, n_q = [4096, 8192, 16384, 22016], 64, [512, 1024, 2048], 256
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "python": platform.python_version(), "device": device,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None, "smoke": a.smoke,
            "lens": lens, "heads": heads, "topk": ks, "prefill_queries": n_q,
            "sglang_lifted": {k: ".".join(v) for k, v in MODULES.items()}}
    res = Results(a.out, meta)
    t0 = time.time()
    parts = sglang_parts(a.sglang_src)
    s = Setup(lens, heads, device)
    cache16, kv16, kv8 = stores(s, parts, res)
    decode(s, parts, kv16, kv8, ks, res)
    prefill(s, parts, cache16, kv8, ks, n_q, res)
    graphs_and_timing(s, parts, kv16, kv8, ks[-1], res)
    res.data["meta"]["seconds"] = round(time.time() - t0, 1)
    res.flush()
    failed = [k for k, v in res.data["checks"].items() if not v]
    print(f"{len(res.data['checks']) - len(failed)}/{len(res.data['checks'])} checks pass"
          + (f"; FAILED: {failed}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
