"""DeepSeek-V4 bf16 index keys, kernel-level evidence (the seed's precision effect).

    python benchmarks/v4_gpu_evidence.py --sglang-source WHEEL_OR_TREE --out DIR [--smoke]

1. niah's V4 store kernel vs its torch reference (fp8 bitwise, bf16 exact), decode and
   prefill plans, at the full key count.
2. SGLang 0.5.23's own compressor write (`_forward_compress_all_in_one`) and C4 indexer
   (`forward_c4_indexer`, its top-k transform), lifted from the source (v4_lift.py), with
   random weights of V4's shapes (64 index heads x 128, rope 64, C4 pages of 64), in two
   arms on the same inputs: bf16 = the plugin's path (bf16 pool, niah store + bf16 paged
   logits); fp8 = stock (SGLang's fp8 torch logits over fp8 rows of V4's rule).
3. Each arm's logits vs float64 logits (fp8 query, float64 keys: RMSNorm, RoPE, Hadamard),
   and the top-k overlap of each arm's selection with the float64 selection, at contexts
   of 4,096 and 22,597 tokens (1,024 and 5,649 compressed keys).
--smoke: tiny shapes on CPU (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from pathlib import Path

import torch

SMOKE = "--smoke" in sys.argv
if SMOKE or not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import v4_lift  # noqa: E402
from v4_lift import HEAD_DIM, PAGE, RATIO  # noqa: E402

EPS = 1e-6


def make_inputs(n_keys, rows, heads, seed, device):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(n_keys, HEAD_DIM, generator=g) * (0.5 + torch.rand(n_keys, 1, generator=g))
    kv[:, torch.randperm(HEAD_DIM, generator=g)[:4]] *= 8  # a few outlier channels, as real keys have
    weight = 1 + 0.2 * torch.randn(HEAD_DIM, generator=g)
    ang = torch.arange(RATIO * n_keys + RATIO, dtype=torch.float64)[:, None] / (
        10000 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))[None, :]
    freqs = torch.polar(torch.ones_like(ang), ang).to(torch.complex64)
    q = torch.randn(rows, heads, HEAD_DIM, generator=g)
    qs = q.abs().amax(-1, keepdim=True) / 448
    q8 = (q / qs).to(torch.float8_e4m3fn)
    w = torch.randn(rows, heads, 1, generator=g) * qs  # the query scale folded into the weights
    pages = -(-n_keys // PAGE)
    table = torch.randperm(pages + 3, generator=g)[:pages].int()
    d = dict(kv=kv.bfloat16(), weight=weight, freqs=freqs, q8=q8, w=w.float(), table=table)
    return {k: v.to(device) for k, v in d.items()}


def float64_keys(inp, n):
    """RMSNorm, complex RoPE at position 4i, Sylvester Hadamard, all in float64."""
    x = inp["kv"].double()
    x = x / torch.sqrt((x * x).mean(1, keepdim=True) + EPS) * inp["weight"].to(torch.bfloat16).double()
    rot = torch.view_as_complex(x[:, 64:].reshape(n, 32, 2).contiguous())
    f = inp["freqs"][torch.arange(n, device=x.device) * RATIO].to(torch.complex128)
    x = torch.cat((x[:, :64], torch.view_as_real(rot * f).reshape(n, 64)), 1)
    h = torch.ones(1, 1, dtype=torch.float64, device=x.device)
    while h.shape[0] < HEAD_DIM:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return x @ h.T / HEAD_DIM**0.5


def prefill_plan(n, plan_cls, device):
    words = torch.zeros(n, 4, dtype=torch.int32)
    words[:, 0] = RATIO * (torch.arange(n, dtype=torch.int32) + 1)
    words[:, 1] = torch.arange(n, dtype=torch.int32)  # ragged_id (uint16)
    return plan_cls(RATIO, words.view(torch.uint8).reshape(n, 16).to(device),
                    torch.zeros(n, 8, dtype=torch.uint8, device=device))


def slots(inp, n):
    i = torch.arange(n, device=inp["table"].device)
    return inp["table"].long()[i // PAGE] * PAGE + i % PAGE


def run_arm(src, arm, inp, n, k, device):
    """SGLang's lifted write + C4 indexer read for one arm; returns (logits, raw top-k indices)."""
    capture = {}
    pool = v4_lift.make_pool(src, arm, int(inp["table"].max()) + 1, device)
    be = v4_lift.make_backend(src, arm, pool, capture)
    decode_cls, prefill_cls = be.plan_classes
    be.forward_metadata = types.SimpleNamespace(c4_compress_metadata=prefill_plan(n, prefill_cls, device))
    be._forward_compress_all_in_one(
        kv_score_buffer=torch.zeros(1, RATIO, 4 * HEAD_DIM, device=device), kv_score_input=inp["kv"],
        ape=torch.zeros(2 * RATIO, HEAD_DIM, device=device), head_dim=HEAD_DIM,
        norm=types.SimpleNamespace(weight=inp["weight"], variance_epsilon=EPS), freqs_cis_cache=inp["freqs"],
        kv_cache=pool.get_index_k_with_scale_buffer(0).view(torch.uint8), is_indexer=True, rotate=True,
        compress_ratio=RATIO, page_size=PAGE, out_loc=slots(inp, n))
    rows = inp["q8"].shape[0]
    meta = be.metadata_class(page_size=256, compressed_page_size=PAGE, page_table=inp["table"][None].expand(rows, -1)
                             .contiguous(), compressed_seq_lens=torch.full((rows,), n, dtype=torch.int32,
                                                                           device=device), use_topk_v2=False)
    core = types.SimpleNamespace(positions=torch.arange(rows, device=device),
                                 c4_sparse_page_indices=torch.empty(rows, k, dtype=torch.int32, device=device),
                                 c4_sparse_raw_indices=torch.empty(rows, k, dtype=torch.int32, device=device))
    be.forward_metadata = types.SimpleNamespace(indexer_metadata=meta, core_metadata=core)
    c4 = types.SimpleNamespace(layer_id=0, compressor=None, use_fp4_indexer=False, index_topk=k,
                               compute_weights=lambda x, skip_scale=False: inp["w"],
                               compute_q=lambda q_lora, positions, weights, q_lora_quant=None: (inp["q8"], weights))
    fb = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_idle=lambda: False, is_decode=lambda: True))
    empty = torch.empty(rows, 1, device=device)
    be.forward_c4_indexer(x=empty, q_lora=empty, c4_indexer=c4, forward_batch=fb, skip_compressor=True)
    return capture["logits"][:, :n].float(), core.c4_sparse_raw_indices.long(), pool


def overlap(sel, ref_sel):
    hits = [len(set(a.tolist()) & set(b.tolist())) / len(b) for a, b in zip(sel.cpu(), ref_sel.cpu())]
    return sum(hits) / len(hits), min(hits)


def topk_case(src, tokens, rows, heads, topks, device):
    from niah.kernels import calc_diff

    n = tokens // RATIO
    inp = make_inputs(n, rows, heads, seed=tokens, device=device)
    k64 = float64_keys(inp, n)
    q64 = inp["q8"].double()
    ref = (torch.relu(torch.einsum("rhd,nd->rhn", q64, k64)) * inp["w"].double()).sum(1)  # [rows, n]
    out = {"tokens": tokens, "compressed_keys": n, "query_rows": rows, "heads": heads, "topk": {}}
    for k in topks:
        ref_sel = ref.topk(min(k, n), dim=1).indices
        row = {}
        for arm in ("fp8", "bf16"):
            logits, raw, _ = run_arm(src, arm, inp, n, k, device)
            sel = raw[:, : min(k, n)]
            mean, worst = overlap(sel, ref_sel)
            row[arm] = {"logits_calc_diff_vs_float64": calc_diff(logits.double(), ref),
                        "topk_overlap_with_float64_mean": mean, "topk_overlap_with_float64_min": worst,
                        "valid_indices": bool((sel >= 0).all() and (sel < n).all())}
        row["trivial"] = n <= k  # SGLang selects every key when the context has <= k of them
        out["topk"][str(k)] = row
    return out


def store_case(n, device):
    from niah.kernels import store_v4_index_keys
    from niah.kernels.v4_store.reference import ref_store_v4_index_keys

    inp = make_inputs(n, 1, 1, seed=7, device=device)
    freqs = torch.view_as_real(inp["freqs"]).flatten(-2)
    res = {}
    for mode in ("prefill", "decode"):
        words = torch.zeros(n, 4, dtype=torch.int32)
        words[:, 0] = RATIO * (torch.arange(n, dtype=torch.int32) + 1) + (1 if mode == "decode" else 0) * (
            torch.arange(n) % 3 == 0).int()  # decode: every third token is not a multiple of 4 (skipped)
        words[:, 1] = torch.randperm(n).int()
        plan = words.view(torch.uint8).reshape(n, 16).to(device)
        for dt, stride in (("fp8", 132 * PAGE), ("bf16", 256 * PAGE), ("bf16", 264 * PAGE)):
            pages = int(inp["table"].max()) + 1
            poison = torch.randint(0, 256, (pages, stride), dtype=torch.uint8, device=device)
            got, want = poison.clone(), poison.clone().cpu()
            args = (mode == "decode", RATIO, inp["weight"], EPS)
            store_v4_index_keys(inp["kv"], plan, *args, freqs, slots(inp, n), got, dt, PAGE, stride)
            ref_store_v4_index_keys(inp["kv"].cpu(), plan.cpu(), *args[:2], inp["weight"].cpu(), EPS,
                                    freqs.cpu(), slots(inp, n).cpu(), want, dt, PAGE)
            res[f"{mode}.{dt}.stride{stride // PAGE}"] = {
                "bytes_differing": int((got.cpu() != want).sum()), "bitwise_equal": bool(torch.equal(got.cpu(), want))}
    return res


def graph_case(n, device):
    """The store captured in a CUDA graph and replayed: same bytes as the eager launch."""
    from niah.kernels import store_v4_index_keys

    inp = make_inputs(n, 1, 1, seed=9, device=device)
    freqs = torch.view_as_real(inp["freqs"]).flatten(-2)
    words = torch.zeros(n, 4, dtype=torch.int32)
    words[:, 0] = RATIO * (torch.arange(n, dtype=torch.int32) + 1)
    plan = words.view(torch.uint8).reshape(n, 16).to(device)
    res = {}
    for dt, stride in (("fp8", 132 * PAGE), ("bf16", 264 * PAGE)):
        pages = int(inp["table"].max()) + 1
        eager = torch.zeros(pages, stride, dtype=torch.uint8, device=device)
        cache = torch.zeros_like(eager)
        args = (inp["kv"], plan, True, RATIO, inp["weight"], EPS, freqs, slots(inp, n))
        store_v4_index_keys(*args, eager, dt, PAGE, stride)
        store_v4_index_keys(*args, cache, dt, PAGE, stride)  # compile outside the capture
        cache.zero_()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            store_v4_index_keys(*args, cache, dt, PAGE, stride)
        cache.zero_()
        g.replay()
        torch.cuda.synchronize()
        res[dt] = {"graph_replay_bitwise_equal_to_eager": bool(torch.equal(cache, eager))}
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sglang-source", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    from niah.serving.sglang import attest

    device = "cpu" if a.smoke or not torch.cuda.is_available() else "cuda"
    attest.configure("bf16", "niah")  # as plugin.install records it in a bf16 server process
    src = v4_lift.Source(a.sglang_source)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (TRITON_INTERPRET=1)",
           "torch": torch.__version__, "smoke": a.smoke}
    path = out / ("v4-evidence-smoke.json" if a.smoke else "h200-v4-evidence.json")

    def save():
        path.write_text(json.dumps(res, indent=1))

    t = time.time()
    res["store"] = store_case(300 if a.smoke else 5649, device)
    print("store:", json.dumps(res["store"]), f"({time.time() - t:.1f}s)", flush=True)
    save()
    if device == "cuda":
        res["store_cuda_graph"] = graph_case(5649, device)
        print("store in a CUDA graph:", json.dumps(res["store_cuda_graph"]), flush=True)
        save()
    cases = [(1200, 4, 8, (64, 512))] if a.smoke else [(4096, 64, 64, (512, 1024)), (22597, 64, 64, (512, 1024))]
    res["selection"] = []
    for tokens, rows, heads, topks in cases:
        t = time.time()
        res["selection"].append(topk_case(src, tokens, rows, heads, topks, device))
        print(f"{tokens} tokens:", json.dumps(res["selection"][-1]["topk"]), f"({time.time() - t:.1f}s)", flush=True)
        save()
    res["attest"] = attest.snapshot()
    save()
    print("attest:", json.dumps(res["attest"]), flush=True)


if __name__ == "__main__":
    main()
