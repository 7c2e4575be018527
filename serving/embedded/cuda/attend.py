"""Attention over the kept keys only: `sparse_attention` (the Triton kernel of
sparse_kernel.py, each query's kept rows gathered; or a prefill chunk's tiles of queries by
union_kernel.py, each over the union of its queries' kept keys: `union_attention`) and
`sparse_attention_reference` (torch, the same math through a mask).

q [1, H, T, D] fp32 (post-RoPE), the layer's KV cache k, v [1, Hkv, S_cap, D] fp32,
idx [T, K] int32 kept positions per query (-1 = none) -> [1, H, T, D] fp32.
Scale D^-0.5 (SDPA's default, as the CPU server's attention). `precision`: the kernel's
products, "tf32x3" (default), "ieee" or "broadcast" (the first version, a benchmark's
baseline; sparse_kernel.py says what each is). `one_head`: a program per query head instead
of per kv head (default False). `split_keys`: split each query's K keys into programs of that
many, rounded up to the key tile (split-K, partials combined by a second launch; any number
of queries when given, DECODE_SPLIT_KEYS by default for fewer than DECODE_ROWS); 0, or a
rounded split >= K: no split. `share`: queries a program sharing the union of their kept keys
(`union_attention`; PREFILL_SHARE by default for a prefill chunk, 0 = the gather kernel).
`end`: every kept position is below it (a causal prefill chunk: its last position + 1; None:
S_cap; 1..S_cap); the bitmap build's scratch is sized by it, in whole words of 32 positions (a
position past the last word would be dropped: the caller's bound is the contract).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from niah.kernels._common import check_device, interpreting, next_pow2
from niah.kernels._launch import launcher_of

# the kernels, launched through niah.kernels._launch (Triton's launcher once a specialisation,
# then its compiled binary directly: docs/kernels.md, "Direct launch"; the kernel modules, which
# import triton, load at the first launch)
_SPARSE = ("niah.serving.embedded.cuda.sparse_kernel", "sparse_attention_kernel")
_COMBINE = ("niah.serving.embedded.cuda.sparse_kernel", "sparse_attention_combine_kernel")
_UNION = ("niah.serving.embedded.cuda.union_kernel", "union_attention_kernel")
_TILE_UNION = ("niah.serving.embedded.cuda.union_kernel", "tile_union_kernel")
_TILE_UNION_BITMAP = ("niah.serving.embedded.cuda.union_kernel", "tile_union_bitmap_kernel")
UNION_BUILDS = ("sort", "bitmap")


PRECISIONS = ("tf32x3", "ieee", "broadcast")
# A prefill chunk's launch ("tf32x3", at least PREFILL_ROWS queries): 2 warps and 2 pipeline
# stages, 64 keys a step. H200 sweep of tiles x warps x stages (benchmarks/kernels/sparse_attention.py
# --tune, 4,096 queries over 22,600 tokens): 0.76 ms against 1.19 ms at 4 warps and Triton's
# default stages for k 512, 1.48 against 2.32 for k 1024 (random and window selections alike).
# The same 64-key steps, but the warps split the tile's reductions another way: outputs differ
# from the 4-warp launch by at most 9e-8 (fp32 rounding; the error against SDPA is unchanged).
# Decode (one query a launch) keeps 4 warps: the sweep did not time it.
PREFILL_ROWS = 256
PREFILL_LAUNCH = {"num_warps": 2, "num_stages": 2}
# Fewer queries than this: a decode step's launch.
DECODE_ROWS = 16
# Keys a program for those few queries (`split_keys`: split-K, sparse_kernel.py). One H100,
# one query x 9 heads in a CUDA graph (benchmarks/kernels/decode_step.py): over 1,024 kept
# keys 5.7 us split by 64 against 39.7 us unsplit (7.0x; 128: 4.9x, 256: 3.1x), over 512
# 5.5 against 20.7 (3.8x); the output moves by fp32 rounding (at most 4.5e-8 there).
# A program per query head (`one_head`) was level or slower (0.96x unsplit, 0.90x split by 64).
DECODE_SPLIT_KEYS = 64
# A prefill chunk's queries a program of union_attention (the gather kernel pads a program's
# G = 3 heads to 16 rows: 4 queries x 4 fill them); 0: the gather kernel, the default. One H100,
# a 4,096-query chunk at 12,189 tokens, k 1,024 (benchmarks/kernels/sparse_attention.py
# --union): the attention alone 0.86 ms against the
# gather's 1.44 where neighbouring queries share keys as the real indexer's do (1.9 x K a tile
# of 4; the model's own rows: 1.73), 0.48 for a sliding window, 1.55 for random rows (3.4 x K);
# but the union's build in torch took 0.63 ms, so the whole request did not gain (docs/
# embedded-server.md). 2 warps: 0.86 against 1.11 at 4 in that case, and faster at 2 in every
# case timed at tiles of 4. tile_union as one kernel, timed (one H100, the same benchmark,
# device/union_attention-tile-kernel-h100.jsonl): 0.41-0.43 ms a chunk at k 1,024 (torch:
# 0.62-0.64), so the union with its build is 1.11x the gather at 12,189 tokens and 0.97x at
# 22,600 on the rows that share keys: about 13 ms off a 12,189-token prefill, not the 38-48 the
# k 1,024 arms are above dense. tile_union_bitmap (no sort; device/union_attention-bitmap-h100.jsonl):
# 0.16-0.18 ms, the union with it 1.40x the gather at 12,189 and 1.17x at 22,600 (about 36 ms
# off that prefill). The request-level run decided (one H100, the seed's arms one at a time and its matrix,
# results/h200-seed-sweep/device/h100-*-union/; docs/embedded-server.md): with tiles of 4 and the
# bitmap build every fused arm's matrix job finished before dense's, and at 22,600 tokens every
# fused arm's median trial was 0.73-0.85x dense's. 0 gives the gather kernel back.
PREFILL_SHARE = 4
UNION_BLOCK_Q = 4      # union_attention's own default tile (what a share of PREFILL_SHARE > 0 would be)
UNION_BLOCK_N = 64
UNION_LAUNCH = {"num_warps": 2}
UNION_BUILD = "bitmap"   # union_attention's build by default (UNION_BUILDS: tile_union or tile_union_bitmap)


def launch_options(precision: str, T: int, num_warps: int | None = None, num_stages: int | None = None) -> dict:
    """The kernel's warps and stages for T queries: PREFILL_LAUNCH for a "tf32x3" prefill
    chunk, else 4 warps at Triton's default stages; what the caller names wins."""
    out = dict(PREFILL_LAUNCH) if precision == "tf32x3" and T >= PREFILL_ROWS else {"num_warps": 4}
    if num_warps:
        out["num_warps"] = num_warps
    if num_stages:
        out["num_stages"] = num_stages
    return out


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                     block_n: int | None = None, num_warps: int | None = None,
                     precision: str = "tf32x3", num_stages: int | None = None,
                     one_head: bool = False, split_keys: int | None = None,
                     share: int | None = None, end: int | None = None) -> torch.Tensor:
    _, H, T, D = q.shape
    Hkv = k.shape[1]
    if idx.dtype != torch.int32 or idx.dim() != 2 or idx.shape[0] != T:
        raise ValueError(f"sparse_attention: idx must be int32 [{T}, K], got {idx.dtype} {tuple(idx.shape)}")
    if precision not in PRECISIONS:
        raise ValueError(f"sparse_attention: precision must be one of {PRECISIONS}, not {precision!r}")
    if H % Hkv or q.dtype != torch.float32 or k.dtype != torch.float32 or v.dtype != torch.float32:
        raise ValueError("sparse_attention: fp32 q, k, v with H a multiple of Hkv")
    _check_end(end, k.shape[2], "sparse_attention")
    check_device(q, k, v, idx)
    G = H // Hkv
    qt = q[0].transpose(0, 1)                                    # [T, H, D] (a view)
    if qt.stride(2) != 1:
        qt = qt.contiguous()
    kk, vv = k[0], v[0]                                          # [Hkv, S_cap, D]
    idx = idx if idx.stride(1) == 1 else idx.contiguous()
    out = torch.empty(T, H, D, dtype=torch.float32, device=q.device)
    if T == 0:
        return out.transpose(0, 1)[None]
    K = idx.shape[1]
    if share is None:
        share = PREFILL_SHARE if T >= PREFILL_ROWS and split_keys is None and not one_head \
            and precision != "broadcast" else 0
    elif share and (split_keys is not None or one_head or block_n or num_warps or num_stages):
        raise ValueError("sparse_attention: share is union_attention's tile; split_keys, one_head, block_n, "
                         "num_warps and num_stages are the gather kernel's")
    if share:
        return union_attention(q, k, v, idx, block_q=share, precision=precision, end=end)
    broadcast = precision == "broadcast"
    block_n = block_n or (16 if interpreting() else 32 if broadcast else 64)
    few = T < DECODE_ROWS
    one_head = bool(one_head)
    split = _split_keys(DECODE_SPLIT_KEYS if split_keys is None and few else split_keys or 0, K, block_n)
    n_split = -(-K // split) if split else 1
    part = torch.empty(T * H * n_split * (D + 2) if split else 1, dtype=torch.float32, device=q.device)
    launcher_of(*_SPARSE)((T, H if one_head else Hkv, n_split),
        qt, kk, vv, idx, out, part, D ** -0.5,
        qt.stride(0), qt.stride(1), kk.stride(0), kk.stride(1), vv.stride(0), vv.stride(1),
        idx.stride(0), out.stride(0), out.stride(1), H,
        K=K, G=G, BLOCK_G=next_pow2(G) if broadcast else max(16, next_pow2(G)), D=D, BLOCK_N=block_n,
        PRECISION=precision, ONE_HEAD=one_head, SPLIT_KEYS=split,
        **launch_options(precision, T, num_warps, num_stages),
    )
    if split:
        launcher_of(*_COMBINE)((T, H), part, out, out.stride(0), out.stride(1),
                               H=H, NS=n_split, BLOCK_S=next_pow2(n_split), D=D, num_warps=4)
    return out.transpose(0, 1)[None]                             # [1, H, T, D]


def union_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                    block_q: int = UNION_BLOCK_Q, block_n: int = UNION_BLOCK_N, precision: str = "tf32x3",
                    num_warps: int | None = None, num_stages: int | None = None,
                    build: str | None = None, end: int | None = None) -> torch.Tensor:
    """sparse_attention's result (same arguments and shapes) by union_kernel.py: tiles of
    block_q consecutive queries, each over the union of its queries' kept keys (`tile_union`,
    or `tile_union_bitmap` with build="bitmap": the same entries; UNION_BUILD by default), every
    union key's k and v rows loaded once for the tile. end: as sparse_attention's (the bitmap's
    positions; the sort needs no bound)."""
    _, H, T, D = q.shape
    Hkv = k.shape[1]
    if idx.dtype != torch.int32 or idx.dim() != 2 or idx.shape[0] != T:
        raise ValueError(f"union_attention: idx must be int32 [{T}, K], got {idx.dtype} {tuple(idx.shape)}")
    if precision not in ("tf32x3", "ieee"):
        raise ValueError(f"union_attention: precision must be 'tf32x3' or 'ieee', not {precision!r}")
    build = build or UNION_BUILD
    if build not in UNION_BUILDS:
        raise ValueError(f"union_attention: build must be one of {UNION_BUILDS}, not {build!r}")
    if H % Hkv or q.dtype != torch.float32 or k.dtype != torch.float32 or v.dtype != torch.float32:
        raise ValueError("union_attention: fp32 q, k, v with H a multiple of Hkv")
    GP = next_pow2(H // Hkv)
    if block_q not in (1, 2, 4, 8, 16) or block_q * GP < 16 or block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"union_attention: block_q a power of 2 <= 16 with block_q x next_pow2(G) >= 16, "
                         f"block_n a power of 2 >= 16; got {block_q}, {block_n}")
    _check_end(end, k.shape[2], "union_attention")
    check_device(q, k, v, idx)
    qt = q[0].transpose(0, 1)                                    # [T, H, D] (a view)
    if qt.stride(2) != 1:
        qt = qt.contiguous()
    kk, vv = k[0], v[0]
    out = torch.empty(T, H, D, dtype=torch.float32, device=q.device)
    if T == 0:
        return out.transpose(0, 1)[None]
    pos, who, count = (tile_union if build == "sort" else tile_union_bitmap)(idx, block_q, end or k.shape[2])
    launch = dict(UNION_LAUNCH)
    if num_warps:
        launch["num_warps"] = num_warps
    if num_stages:
        launch["num_stages"] = num_stages
    launcher_of(*_UNION)((pos.shape[0], Hkv),
        qt, kk, vv, pos, who, count, out, D ** -0.5, T,
        qt.stride(0), qt.stride(1), kk.stride(0), kk.stride(1), vv.stride(0), vv.stride(1),
        pos.stride(0), out.stride(0), out.stride(1),
        G=H // Hkv, GP=GP, BLOCK_Q=block_q, D=D, BLOCK_N=block_n, PRECISION=precision,
        N_CONST=-(-pos.shape[1] // block_n) * block_n if interpreting() else 0, **launch,
    )
    return out.transpose(0, 1)[None]


def tile_union(idx: torch.Tensor, block_q: int, S: int,
               num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """idx [T, K] int32 kept positions (< S, distinct within a row; -1 pads) -> for each tile
    of block_q consecutive rows (the last padded with rows keeping nothing): pos [n_tiles, L]
    int32 the union of its rows' positions, ascending, in its first count[tile] entries (the
    rest unspecified); who [n_tiles, L] int32, bit i set where the tile's row i keeps that
    position; count [n_tiles] int32. L = block_q x K. One launch of union_kernel.py's
    tile_union_kernel (a program a tile, its codes sorted in registers; num_warps: 4 up to
    4,096 codes a tile, else 8, by default); the same entries as `tile_union_reference`."""
    idx, T, K, n, (pos, who, count) = _union_outputs(idx, block_q, S)
    LP = next_pow2(block_q * K)
    scratch = torch.empty(n, LP, dtype=torch.int32, device=idx.device)
    launcher_of(*_TILE_UNION)((n,), idx, pos, who, count, scratch, T, idx.stride(0), pos.stride(0),
                              K=K, BLOCK_Q=block_q, LP=LP, num_warps=num_warps or (4 if LP <= 4096 else 8))
    return pos, who, count


def tile_union_bitmap(idx: torch.Tensor, block_q: int, S: int,
                      num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tile_union's entries (same arguments and outputs) without a sort: union_kernel.py's
    tile_union_bitmap_kernel, a bitmap of S bits a row of the tile (scratch of block_q x S / 8
    bytes a tile, zeroed by the kernel only up to the tile's highest position), then a scan of
    its words in position order. 2.3-2.6x faster than tile_union at k 1,024 on one H100
    (docs/embedded-server.md); the prefill's build where UNION_BUILD = "bitmap"."""
    idx, T, K, n, (pos, who, count) = _union_outputs(idx, block_q, S)
    W = -(-S // 32)
    bits = torch.empty(n, block_q, W, dtype=torch.int32, device=idx.device)
    WB = 256
    launcher_of(*_TILE_UNION_BITMAP)((n,), idx, pos, who, count, bits, T, W, idx.stride(0), pos.stride(0),
                                     K=K, KP=next_pow2(K), BLOCK_Q=block_q, WB=WB,
                                     W_CONST=-(-W // WB) * WB if interpreting() else 0, num_warps=num_warps or 4)
    return pos, who, count


def _union_outputs(idx: torch.Tensor, block_q: int, S: int):
    """Both builds' prologue: idx with unit column stride, T, K, the tile count, and the
    uninitialised pos [n, L], who [n, L], count [n] (int32) they fill."""
    T, K = idx.shape
    _check_codes(S, block_q)
    n = -(-T // block_q)
    outs = tuple(torch.empty(shape, dtype=torch.int32, device=idx.device)
                 for shape in ((n, block_q * K), (n, block_q * K), (n,)))
    return (idx if idx.stride(1) == 1 else idx.contiguous()), T, K, n, outs


def _check_end(end: int | None, S_cap: int, name: str) -> None:
    if end is not None and not 0 < end <= S_cap:
        raise ValueError(f"{name}: end must be in 1..{S_cap} (the cache's capacity), got {end}")


def _check_codes(S: int, block_q: int) -> None:
    if S * block_q >= 2 ** 31:
        raise ValueError(f"tile_union: {S} positions x {block_q} rows a tile overflow int32")


def tile_union_reference(idx: torch.Tensor, block_q: int, S: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tile_union's entries in torch (its reference, and the form the benchmark times beside
    it; no host sync either): one sort of position x block_q + row a tile, the first of each
    run of a position numbered by a running sum, its rows' bits summed into its slot. Entries
    past count are 0; pos and who are views of one row stride (L + 1)."""
    T, K = idx.shape
    _check_codes(S, block_q)
    n = -(-T // block_q)
    L = block_q * K
    dev = idx.device
    rows = idx if n * block_q == T else torch.cat([idx, idx.new_full((n * block_q - T, K), -1)])
    r = torch.arange(block_q, dtype=torch.int32, device=dev).repeat(n)[:, None]     # [n * block_q, 1]
    big = torch.iinfo(torch.int32).max
    code = torch.where(rows >= 0, rows * block_q + r, big).view(n, L).sort(dim=1).values
    valid = code != big
    p = torch.div(code, block_q, rounding_mode="floor")
    first = valid.clone()
    first[:, 1:] &= p[:, 1:] != p[:, :-1]
    slot = first.cumsum(1, dtype=torch.int32) - 1                                  # [n, L]: the run's slot
    count = first.sum(1, dtype=torch.int32)
    bit = torch.bitwise_left_shift(torch.ones_like(code), code.remainder(block_q))
    who = torch.zeros(n, L + 1, dtype=torch.int32, device=dev)                      # column L: the dump
    who.scatter_add_(1, torch.where(valid, slot, L).long(), torch.where(valid, bit, 0))
    pos = torch.zeros(n, L + 1, dtype=torch.int32, device=dev)
    pos.scatter_(1, torch.where(first, slot, L).long(), torch.where(first, p, 0))
    return pos[:, :L], who[:, :L], count


def _split_keys(split: int, K: int, block_n: int) -> int:
    """Keys a program (a multiple of block_n), 0 where one program walks all K anyway."""
    if split < 0:
        raise ValueError(f"sparse_attention: split_keys must be >= 0, got {split}")
    split = -(-split // block_n) * block_n if split else 0
    return split if 0 < split < K else 0


def sparse_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """SDPA over the whole cache prefix with everything but idx masked (what the CPU server does)."""
    T = q.shape[2]
    S = int(idx.max()) + 1
    mask = torch.full((T, S), float("-inf"), device=q.device)
    safe = idx.clamp_min(0).long()
    mask.scatter_(1, safe, torch.where(idx >= 0, 0.0, float("-inf")).to(mask.dtype))
    # a -1 pad scattered onto column 0 must not hide a real pick of column 0
    picked0 = (idx == 0).any(1)
    mask[picked0, 0] = 0.0
    return F.scaled_dot_product_attention(q, k[:, :, :S], v[:, :, :S], attn_mask=mask[None, None], enable_gqa=True)
