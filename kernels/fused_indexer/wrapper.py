"""indexer_topk: the top-k key positions of prefill rows, read from the paged pool, no logits tensor
(and indexer_logits: the same scores written out, for a caller that selects from them).

    indexer_topk(q [C, Hkv, G, D] bf16|e4m3, weights [C, Hkv, G] f32, pages, block_table [Hkv, P] i32,
                 p0, k, index_dtype) -> (idx int32 [C, min(k, p0 + C)], ok bool [C])

Row i is the query at position p0 + i; its candidates are the keys at positions 0..p0 + i of
every kv head g (pages: one layer's buffer of the paged pool, `[pages, 64 * row]`, uint8 for
fp8 pages (64 x D e4m3, then 64 fp32 scales), bf16 for bf16 pages; block_table[g] lists kv
head g's pages in position order). Scores as kernels/fused_indexer/reference.py; weights carry
the head weight (and, for fp8 queries, the query's scale). idx lists a row's kept positions in
position order when it has at most k candidates (then -1), else in unspecified order; ties at
the k-th score keep the lowest positions. No [C, S] tensor is written:

1. a sample of every STRIDE-th key, scored in torch ([C, S / STRIDE]), gives each row a lower
   bracket lo: the R-th largest sampled score (R = sample_brackets(k, STRIDE)[1]), -inf when
   the row has fewer samples;
2. `candidates`: the kernel (kernel.py) keeps, in position order, every key scoring > lo and
   the first k keys (lowest positions) scoring == lo in a [C, CAP] candidate buffer pre-filled
   with position -1, and counts both kinds (ngt, neq). A bracket of 0, which ReLU scores give
   a row with fewer than about k keys above 0, so costs at most k slots, however many keys
   score 0;
3. `select`: `topk_indices` over the row's n = ngt + min(neq, k) slots (its tie rule keeps the
   lowest slots, i.e. positions), then each row's own check.

ok[i] is False where the bracket missed (ngt + neq < min(k, p0 + i + 1)), the buffer
overflowed (n > CAP), its buffer fails its own check (the first min(n, CAP) slots must hold
rising positions: a slot never written reads -1), or its idx does (a position outside
0..p0 + i, a -1 too early, a slot at or past n, a position twice); such a row's idx is not its
top-k, and the caller must score it another way (the GPU server's benchmark arm re-runs the
chunk unfused).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from niah.kernels._common import check_device, interpreting, next_pow2
from niah.kernels._launch import launcher_of
from niah.kernels.topk.wrapper import SAMPLE_STRIDE, sample_brackets, topk_indices

PAGE = 64
DTYPES = ("fp8", "bf16")


def capacity(k: int, stride: int = SAMPLE_STRIDE) -> int:
    """Candidate slots a row gets: twice the keys expected at or above the bracket, a power of two."""
    return max(256, next_pow2(2 * sample_brackets(k, stride)[1] * stride), 2 * next_pow2(k))


def sampled_keys(pages: torch.Tensor, block_table: torch.Tensor, positions: torch.Tensor, dim: int,
                 index_dtype: str) -> torch.Tensor:
    """The keys at `positions` of every kv head as the indexer reads them: fp32 [Hkv, n, D]."""
    n_pages = pages.shape[0]
    page = block_table[:, positions // PAGE].long()                       # [Hkv, n]
    slot = (positions % PAGE).long()[None, :].expand_as(page)
    if index_dtype == "bf16":
        return pages.view(n_pages, PAGE, dim)[page, slot].float()
    vals = pages[:, :PAGE * dim].reshape(n_pages, PAGE, dim)[page, slot]  # uint8 [Hkv, n, D]
    scales = pages[:, PAGE * dim:].reshape(n_pages, PAGE, 4)[page, slot]  # uint8 [Hkv, n, 4]
    return vals.view(torch.float8_e4m3fn).float() * scales.contiguous().view(torch.float32)


def brackets(q: torch.Tensor, weights: torch.Tensor, pages: torch.Tensor, block_table: torch.Tensor, p0: int,
             k: int, index_dtype: str, stride: int = SAMPLE_STRIDE) -> torch.Tensor:
    """Step 1: fp32 [C] lower brackets from the sampled keys (-inf: keep every key)."""
    C, Hkv, G, D = q.shape
    S = p0 + C
    pos = torch.arange(0, S, stride, device=q.device)
    keys = sampled_keys(pages, block_table, pos, D, index_dtype)        # [Hkv, n, D]
    scores = None
    for g in range(Hkv):
        raw = torch.matmul(q[:, g].float(), keys[g].t()).clamp_min_(0)   # [C, G, n]
        part = (raw * weights[:, g, :, None]).sum(1)
        scores = part if scores is None else scores.add_(part)
    rows = p0 + torch.arange(C, device=q.device)
    scores.masked_fill_(pos[None, :] > rows[:, None], float("-inf"))
    r = sample_brackets(k, stride)[1]
    if r > scores.shape[1]:
        return torch.full((C,), float("-inf"), device=q.device)
    return scores.topk(r, dim=1).values[:, -1].contiguous()


@functools.cache
def _kernel():
    from niah.kernels.fused_indexer.kernel import indexer_candidates_kernel  # noqa: PLC0415 (imports triton lazily)

    return indexer_candidates_kernel


_LOGITS_KERNEL = ("niah.kernels.fused_indexer.kernel", "indexer_logits_kernel")   # loaded at first launch
_PAGES_KERNEL = ("niah.kernels.fused_indexer.kernel", "indexer_logits_pages_kernel")
LOGITS_FORMS = ("tile", "pages")
LOGITS_FORM = "pages"  # indexer_logits' kernel by default ("tile": the first form; docs/kernels.md)
PAGES_A_PROGRAM = 16   # "pages": page positions a program walks (1,024 keys)
PAGES_STAGES = 3       # "pages": the page loop's pipeline depth


def _check(q, weights, pages, block_table, p0, k, index_dtype, name="indexer_topk"):
    """k None: the logits (no top-k)."""
    if index_dtype not in DTYPES:
        raise ValueError(f"{name}: index_dtype must be one of {DTYPES}, got {index_dtype!r}")
    if q.dim() != 4:
        raise ValueError(f"{name}: q must be [C, Hkv, G, D], got {tuple(q.shape)}")
    C, Hkv, G, D = q.shape
    want = torch.float8_e4m3fn if index_dtype == "fp8" else torch.bfloat16
    if q.dtype != want:
        raise ValueError(f"{name}: q must be {want} for {index_dtype} keys, got {q.dtype}")
    if D < 16 or D & (D - 1):
        raise ValueError(f"{name}: head dim must be a power of two >= 16, got {D}")
    if weights.shape != (C, Hkv, G) or weights.dtype != torch.float32:
        raise ValueError(f"{name}: weights must be float32 [{C}, {Hkv}, {G}], "
                         f"got {weights.dtype} {tuple(weights.shape)}")
    row = PAGE * (D + 4) if index_dtype == "fp8" else PAGE * D
    pdt = torch.uint8 if index_dtype == "fp8" else torch.bfloat16
    if pages.dim() != 2 or pages.shape[1] != row or pages.dtype != pdt:
        raise ValueError(f"{name}: pages must be {pdt} [pages, {row}], got {pages.dtype} {tuple(pages.shape)}")
    if pages.stride(1) != 1:
        raise ValueError(f"{name}: a page's bytes must be contiguous (pages.stride(1) == 1), "
                         f"got strides {pages.stride()}")
    if block_table.dim() != 2 or block_table.shape[0] != Hkv or block_table.dtype != torch.int32:
        raise ValueError(f"{name}: block_table must be int32 [{Hkv}, pages], got "
                         f"{block_table.dtype} {tuple(block_table.shape)}")
    if p0 < 0 or (p0 + C + PAGE - 1) // PAGE > block_table.shape[1]:
        raise ValueError(f"{name}: positions 0..{p0 + C - 1} exceed the block table's "
                         f"{block_table.shape[1]} pages")
    if k is not None and int(k) < 1:
        raise ValueError(f"{name}: k must be >= 1, got {k}")
    check_device(q, weights, pages, block_table)


def padded_query(q: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q and weights with G heads padded to GP = max(2, next_pow2(G)) (zero queries and weights)
    and contiguous, as the kernels read them; no copy when they already are."""
    C, Hkv, G, D = q.shape
    GP = max(2, next_pow2(G))
    if GP == G:
        return q.contiguous(), weights.contiguous()
    qp = torch.zeros((C, Hkv, GP, D), dtype=q.dtype, device=q.device)
    qp[:, :, :G] = q
    wp = torch.zeros((C, Hkv, GP), dtype=torch.float32, device=q.device)
    wp[:, :, :G] = weights
    return qp, wp


class Candidates(NamedTuple):
    """Step 2's output: a row's first n = ngt + min(neq, k) slots are its candidates."""

    val: torch.Tensor   # fp32 [C, CAP] scores, position order (unspecified past n)
    pos: torch.Tensor   # int32 [C, CAP] positions (-1 from slot min(n, CAP) on: never written)
    ngt: torch.Tensor   # int32 [C] keys scoring > lo
    neq: torch.Tensor   # int32 [C] keys scoring == lo (the first k of them kept)

    def count(self, k: int) -> torch.Tensor:
        """int32 [C]: the slots the kernel filled, or wanted to (> CAP: overflow)."""
        return self.ngt + self.neq.clamp(max=int(k))


def candidates(q: torch.Tensor, weights: torch.Tensor, pages: torch.Tensor, block_table: torch.Tensor, p0: int,
               k: int, index_dtype: str, cap: int | None = None, block_m: int | None = None,
               block_n: int | None = None, num_warps: int | None = None,
               lo: torch.Tensor | None = None) -> Candidates:
    """Steps 1 and 2 (arguments checked as indexer_topk's)."""
    _check(q, weights, pages, block_table, p0, k, index_dtype)
    C, Hkv, G, D = q.shape
    k = int(k)
    cap = cap or capacity(k)
    qp, wp = padded_query(q, weights)
    GP = qp.shape[2]
    if lo is None:
        lo = brackets(q, weights, pages, block_table, p0, k, index_dtype)
    cval = torch.empty((C, cap), dtype=torch.float32, device=q.device)
    cpos = torch.full((C, cap), -1, dtype=torch.int32, device=q.device)   # a slot never written reads -1
    ngt = torch.empty(C, dtype=torch.int32, device=q.device)
    neq = torch.empty(C, dtype=torch.int32, device=q.device)
    if C == 0:
        return Candidates(cval, cpos, ngt, neq)
    fp8 = index_dtype == "fp8"
    kv = pages.view(torch.float8_e4m3fn) if fp8 else pages
    sf = pages.view(torch.float32) if fp8 else pages
    interp = interpreting()
    block_m = block_m or 16
    block_n = block_n or (64 if interp else 128)   # H200 sweep at 22.6K (docs/kernels.md): 16 x 128, 4 warps
    _kernel()[(triton_cdiv(C, block_m),)](
        qp, wp, kv, sf, block_table, lo.float().contiguous(), cval, cpos, ngt, neq,
        C, p0, k, qp.stride(0), wp.stride(0), block_table.stride(0), kv.stride(0), sf.stride(0) if fp8 else 0,
        HKV=Hkv, GP=GP, D=D, BLOCK_M=block_m, BLOCK_N=block_n, PAGE=PAGE, CAP=cap, IS_FP8=fp8, UPCAST=interp,
        num_warps=num_warps or 4,
    )
    return Candidates(cval, cpos, ngt, neq)


def select(cand: Candidates, p0: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 3 and the rows' checks: (idx, ok) as indexer_topk's."""
    C, cap = cand.pos.shape
    k = int(k)
    kk = min(k, p0 + C)
    device = cand.pos.device
    if C == 0:
        return torch.empty((0, kk), dtype=torch.int32, device=device), torch.ones(0, dtype=torch.bool, device=device)
    n = cand.count(k)
    lengths = n.clamp(max=cap)
    sel = topk_indices(cand.val, kk, lengths=lengths)
    idx = torch.where(sel >= 0, cand.pos.gather(1, sel.clamp_min(0).long()), -1)
    pos = p0 + torch.arange(C, device=device)
    need = torch.clamp(pos + 1, max=k)
    # the row's own check: its filled slots hold rising positions (an unwritten slot reads -1, a
    # slot written twice leaves one unwritten), kept positions inside 0..p, -1 only after
    # min(k, p + 1) kept, every kept slot below the row's count, no position twice
    in_use = torch.arange(1, cap, device=device)[None, :] < lengths[:, None]
    rising = ~((cand.pos[:, 1:] <= cand.pos[:, :-1]) & in_use).any(dim=1) & ((cand.pos[:, 0] >= 0) | (lengths == 0))
    slots = torch.arange(kk, device=device)[None, :]
    in_range = torch.where(slots < need[:, None], (idx >= 0) & (idx <= pos[:, None]), idx == -1)
    in_buffer = sel < lengths[:, None]
    ordered = idx.sort(dim=1).values
    twice = ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any(dim=1)
    ok = (n <= cap) & (n >= need) & rising & in_range.all(dim=1) & in_buffer.all(dim=1) & ~twice
    return idx, ok


def indexer_topk(q: torch.Tensor, weights: torch.Tensor, pages: torch.Tensor, block_table: torch.Tensor, p0: int,
                 k: int, index_dtype: str, cap: int | None = None, block_m: int | None = None,
                 block_n: int | None = None, num_warps: int | None = None,
                 lo: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """See the module docstring. cap / block_m / block_n / num_warps: tuning; lo: brackets to use
    instead of step 1's (tests)."""
    cand = candidates(q, weights, pages, block_table, p0, k, index_dtype, cap=cap, block_m=block_m,
                      block_n=block_n, num_warps=num_warps, lo=lo)
    return select(cand, p0, k)


def logits_form(n_kv: int, form: str | None = None) -> str:
    """The form indexer_logits takes for n_kv kv heads: `form` when given (checked), else
    LOGITS_FORM up to 4 kv heads and "tile" past them."""
    if form is not None and form not in LOGITS_FORMS:
        raise ValueError(f"indexer_logits: form must be one of {LOGITS_FORMS}, got {form!r}")
    return form or (LOGITS_FORM if n_kv <= 4 else "tile")


def indexer_logits(q: torch.Tensor, weights: torch.Tensor, pages: torch.Tensor, block_table: torch.Tensor, p0: int,
                   index_dtype: str, block_m: int | None = None, block_n: int | None = None,
                   num_warps: int | None = None, form: str | None = None) -> torch.Tensor:
    """The fused indexer's scores, written: fp32 [C, p0 + C] (row stride a multiple of 256
    floats, DeepGEMM's 1 KiB alignment), I[i, s] as in the module docstring for s <= p0 + i
    and -inf past it; every kv head read in place from its pages and summed in the kernel, in
    order g = 0, 1, ... (arguments as indexer_topk's, less k). The candidates kernel's tile
    function: under the interpreter a key's score here is, bit for bit, the score that kernel
    compares; on a GPU their launches (the tile form's 8 warps, the candidates kernel's 4) may
    round the head sum another way, in the last bits (seen on the H200).

    form (LOGITS_FORM by default): "tile", a program a [block_m rows, block_n keys] tile, the
    keys gathered one block-table lookup a key; "pages", a program walks PAGES_A_PROGRAM page
    positions for block_m rows (`indexer_logits_pages_kernel`: the rows' queries loaded once, a
    page of every kv head read as one contiguous block a step, the loop pipelined), for up to 4
    kv heads (more: the default takes the tile form; form="pages" is refused). The same scores
    either way (the same operations in one order); block_n is the tile form's only."""
    _check(q, weights, pages, block_table, p0, None, index_dtype, name="indexer_logits")
    C, Hkv, _, D = q.shape
    form = logits_form(Hkv, form)
    S = p0 + C
    stride = -(-S // 256) * 256
    out = torch.empty_strided((C, S), (stride, 1), dtype=torch.float32, device=q.device)
    if C == 0:
        return out
    qp, wp = padded_query(q, weights)
    fp8 = index_dtype == "fp8"
    kv = pages.view(torch.float8_e4m3fn) if fp8 else pages
    sf = pages.view(torch.float32) if fp8 else pages
    interp = interpreting()
    block_m = block_m or 16
    if form == "pages":
        if Hkv > 4:
            raise ValueError(f"indexer_logits: form 'pages' takes at most 4 kv heads, got {Hkv} "
                             "(form 'tile' takes any)")
        grid = (triton_cdiv(triton_cdiv(S, PAGE), PAGES_A_PROGRAM), triton_cdiv(C, block_m))
        launcher_of(*_PAGES_KERNEL)(grid,
            qp, wp, kv, sf, block_table, out,
            C, p0, PAGES_A_PROGRAM, qp.stride(0), wp.stride(0), block_table.stride(0), kv.stride(0),
            sf.stride(0) if fp8 else 0, stride,
            HKV=Hkv, GP=qp.shape[2], D=D, BLOCK_M=block_m, PAGE=PAGE, IS_FP8=fp8, UPCAST=interp,
            STAGES=PAGES_STAGES, num_warps=num_warps or 4,
        )
        return out
    block_n = block_n or (64 if interp else 128)
    grid = (triton_cdiv(S, block_n), triton_cdiv(C, block_m))
    launcher_of(*_LOGITS_KERNEL)(grid,   # the compiled launch, not Triton's ~40 us launcher (_launch.py)
        qp, wp, kv, sf, block_table, out,
        C, p0, qp.stride(0), wp.stride(0), block_table.stride(0), kv.stride(0), sf.stride(0) if fp8 else 0, stride,
        HKV=Hkv, GP=qp.shape[2], D=D, BLOCK_M=block_m, BLOCK_N=block_n, PAGE=PAGE, IS_FP8=fp8, UPCAST=interp,
        # 16 x 128 for sm_90 (benchmarks/kernels/registers.py): 4 warps 227 (fp8) / 255 (bf16)
        # registers a thread, 8 warps 216 / 142, none spilled; not yet timed (indexer_logits.py --tune)
        num_warps=num_warps or 8,
    )
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
