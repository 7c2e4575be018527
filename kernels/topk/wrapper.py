"""topk_indices(logits, k, lengths=None) -> int32 [R, k]: the k largest logits per row.

logits fp32 [R, W] (row stride may exceed W). Candidates of row r: positions < lengths[r]
when lengths (int32 [R]) is given, else every position whose logit is not -inf. Order is
unspecified; a row with L <= k candidates returns them in index order (0..L-1 when
lengths are given), then -1. Ties at the threshold keep the lowest indices.
Any 1 <= k <= 16,384 and any width (measured on the H200 up to k = 2048; larger k use
chunks of 2 * next_pow2(k) keys, up to 32,768 a program). Graph-safe: no host sync.
Three kernels, same results: "sample" (sample_kernel.py, one program a row; the default for
many rows and k <= 2048), "segmented" (segment_kernel.py: the sample select's pass over the row
split over programs, for few long rows; the same keys in the same order as "sample") and
"search" (kernel.py; the default otherwise).
"""

from __future__ import annotations

import math

import torch

from niah.kernels._common import check_device, interpreting, next_pow2
from niah.kernels._launch import launcher_of

# launched through niah.kernels._launch (the kernel modules import triton: loaded at the first launch)
_TOPK = ("niah.kernels.topk.kernel", "topk_kernel")
_SAMPLE = ("niah.kernels.topk.sample_kernel", "sample_topk_kernel")
_SEGMENT = {step: ("niah.kernels.topk.segment_kernel", f"segment_{step}_kernel")
          for step in ("bracket", "count", "scatter", "finish")}

MAX_BLOCK = 32768  # one row (or chunk) per program, held in registers
DEFAULT_BLOCK = 8192  # chunk width of the rounds for many rows (H200 sweep: docs/kernels.md)
DEFAULT_FINAL_BLOCK = 8192  # survivors selected by one program once they fit
DEFAULT_ROWS = 1  # segments per program (H200: sharing reductions across segments did not pay)
MANY_SEGMENTS = 1024  # at least this many 8192-wide segments: split search/select, 8192 chunks
# chunk width for few rows: one H100, one decode row in a CUDA graph (benchmarks/kernels/decode_step.py),
# 4096 against 16384: 1.24-1.42x faster at width 12,288, 1.43-1.71x at 24,576, level at 2,048 (k 512, 1024)
FEW_ROWS_BLOCK = 4096
# where next_pow2(k) >= FEW_ROWS_WIDE_K, few rows take FEW_ROWS_WIDE_BLOCK-wide chunks: a 4,096-wide chunk
# keeps half its keys at k 2,048 (one H100, benchmarks/kernels/topk_decode.py in a CUDA graph: B=64 ragged
# <= 65,536 83.5 against 126.3 us at k 2,048, 98.7 against 146.7 at k 4,096 (8,192-wide then);
# B=1 x 131,072 58.2 against 61.1 and 78.5 against 84.2; the same keys in the same order; k 1,025-2,047
# untimed)
FEW_ROWS_WIDE_K = 2048
FEW_ROWS_WIDE_BLOCK = 16384
SAMPLE_MAX_DEFAULT_K = 2048  # many rows and k <= this -> "sample" by default (H200-measured range); else "search"
SAMPLE_STRIDE = 32  # every 32nd key of a row is sampled (more when the sample would exceed MAX_SAMPLE)
MAX_SAMPLE = 8192
SAMPLE_TILE = 2048  # keys a program reads per step of its pass over the row (H200 sweep: 2048 x 8 warps best)
SAMPLE_WARPS = 8
# at least SAMPLE_MANY_ROWS rows (the prefill's score calls: 742 to 4,096 rows) the sample select runs
# one warp a row with a pass tile of 256 keys (one H100, the server's prefill: 0.243 -> 0.229 s at 12,189
# tokens, 0.539 -> 0.535 at 22,600; the select alone on a 4,096-row chunk 1.12-1.25x faster); below it
# SAMPLE_WARPS and SAMPLE_TILE (64 decode rows: one warp 4.8x slower there). docs/kernels.md, "Top-k".
SAMPLE_MANY_ROWS = 512
SAMPLE_MANY_WARPS = 1
SAMPLE_MANY_TILE = 256
# bits a step of the threshold searches (_search.kth_threshold): 1 is the binary search (32
# block-wide reductions a search), 2 and 4 take 16 and 8 wider ones; every width finds the
# same threshold. On the H200 the binary search was the fastest for both kernels at every
# shape timed but one (tied rows: within 3 %; docs/kernels.md, "Top-k": the sample select
# 1.6x faster at 1 bit than at 4 on [742, 22600] rows, the search 2.4-3.6x): the wider
# steps' comparisons cost more than the reductions they save.
SAMPLE_RADIX_BITS = 1
SEARCH_RADIX_BITS = 1
RADIX_BITS = (1, 2, 4)
MAX_NUMEL = 1 << 20     # Triton's largest tensor: a step counts [searches, 2^bits, keys] comparisons
SAMPLE_SIGMAS = 4.0  # bracket half-width: SAMPLE_SIGMAS * sqrt(k / stride) + 4 sample ranks
FEW_ROWS_METHOD = "search"  # few rows (decode) by default; "segmented" is timed beside it (docs/kernels.md)
SEGMENT_KEYS = 4096  # "segmented": keys a program of the row's pass reads (one tile)
SEGMENT_WARPS = 4  # "segmented": warps of the bracket and pass launches (the finish: SAMPLE_WARPS)
SCRATCH_NARROW = True  # the scratch's search over the bracket only (H100: faster at every shape timed, docs/kernels.md)
SCRATCH_KEYS_A_THREAD = 16  # the sample select holds its scratch in registers up to this many keys a thread
MANY_SELECT_WARPS = 16  # warps of the select launch for many rows (H200: 1.05-1.11x faster than 8)


def _warps(block: int) -> int:
    return 4 if interpreting() else max(4, min(16, block // 1024))  # ~32 positions a thread


def _radix(bits: int | None, default: int) -> int:
    bits = bits or default
    if bits not in RADIX_BITS:
        raise ValueError(f"topk_indices: radix_bits must be one of {RADIX_BITS}, got {bits}")
    return bits


def fit_radix(bits: int, keys: int) -> int:
    """The most bits a step, at most `bits`, whose comparisons ([2^bits, keys] a step: `keys`
    counts every search's keys a program; the binary search, 1, compares [keys]) stay within
    Triton's largest tensor. Fewer bits a step find the same threshold (in more steps), so
    this changes no result."""
    while bits > 1 and (keys << bits) > MAX_NUMEL:
        bits //= 2
    return bits


def _check_args(logits: torch.Tensor, k, lengths: torch.Tensor | None) -> int:
    """k as an int; a clear ValueError for any argument the kernels do not take."""
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"topk_indices: logits must be float32 [R, W], got {logits.dtype} {tuple(logits.shape)}")
    k = int(k)
    if k < 1:
        raise ValueError(f"topk_indices: k must be >= 1, got {k}")
    if 2 * next_pow2(k) > MAX_BLOCK:
        raise ValueError(f"topk_indices: k must be <= {MAX_BLOCK // 2} (one program holds 2 * next_pow2(k) keys), "
                         f"got {k}")
    rows = logits.shape[0]
    if lengths is not None and (lengths.shape != (rows,) or lengths.dtype != torch.int32):
        raise ValueError(f"topk_indices: lengths must be int32 [{rows}], got {lengths.dtype} {tuple(lengths.shape)}")
    return k


def default_block(many: bool, k_pad: int) -> int:
    """The search's chunk width by default: DEFAULT_BLOCK for many rows; for few, FEW_ROWS_BLOCK, or
    FEW_ROWS_WIDE_BLOCK where k_pad (next_pow2(k)) >= FEW_ROWS_WIDE_K; at least 2 * k_pad, the
    least a chunk must hold to shrink the row."""
    few = FEW_ROWS_WIDE_BLOCK if k_pad >= FEW_ROWS_WIDE_K else FEW_ROWS_BLOCK
    return max(DEFAULT_BLOCK if many else few, 2 * k_pad)


def topk_indices(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None,
                 block: int | None = None, final_block: int | None = None,
                 num_warps: int | None = None, rows_per_program: int | None = None,
                 final_warps: int | None = None, split: bool | None = None,
                 select_warps: int | None = None, method: str | None = None,
                 tile: int | None = None, sample_stride: int | None = None, cap: int | None = None,
                 radix_bits: int | None = None) -> torch.Tensor:
    """Top-k indices per row. Tuning (the defaults come from the H200 sweeps in docs/kernels.md):
    block: rows wider than this are cut into chunks of `block` that each keep their top-k;
    final_block: the survivors are selected by one program once they fit in it;
    num_warps / final_warps: warps of the chunk rounds / of the last launch;
    rows_per_program: segments sharing each reduction; split: search the thresholds in one
    launch and select in a second (the search then holds few registers), with select_warps.
    method: "search", "sample" (sample_topk: tile / sample_stride / cap / num_warps) or "segmented"
    (segment_topk: tile is its segment, num_warps its bracket and pass launches);
    radix_bits: bits of the threshold a search step finds, either method (1: binary; at most:
    fewer where a step's comparisons would pass Triton's largest tensor, `fit_radix`)."""

    k = _check_args(logits, k, lengths)
    rows, width = logits.shape
    # H200 sweep (docs/kernels.md): many rows (prefill) -> 8192-wide chunks, search and
    # select in two launches; few rows (decode) -> FEW_ROWS_BLOCK-wide chunks
    many = rows * ((width + DEFAULT_BLOCK - 1) // DEFAULT_BLOCK) >= MANY_SEGMENTS
    # H200: "sample" 1.4-1.6x faster for many rows (k <= 2048), 2.2x slower for one row
    method = method or ("sample" if many and k <= SAMPLE_MAX_DEFAULT_K else "search" if many else FEW_ROWS_METHOD)
    if method not in ("search", "sample", "segmented"):
        raise ValueError(f"topk_indices: method must be 'search', 'sample' or 'segmented', got {method!r}")
    if method == "segmented":
        return segment_topk(logits, k, lengths, segment=tile, stride=sample_stride, cap=cap, num_warps=num_warps,
                          radix_bits=radix_bits)
    if method == "sample":
        return sample_topk(logits, k, lengths, tile=tile, stride=sample_stride, cap=cap, num_warps=num_warps,
                           radix_bits=radix_bits)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    check_device(logits, lengths)
    radix_bits = _radix(radix_bits, SEARCH_RADIX_BITS)
    out = torch.empty((rows, k), dtype=torch.int32, device=logits.device)
    if rows == 0:
        return out
    k_pad = next_pow2(k)
    if split is None:
        split = many
    if select_warps is None and many and split:
        select_warps = MANY_SELECT_WARPS
    block = block or default_block(many, k_pad)
    final_block = max(final_block or DEFAULT_FINAL_BLOCK, block)
    for name, b in (("block", block), ("final_block", final_block)):
        if b & (b - 1) or b < 2 * k_pad or b > MAX_BLOCK:
            raise ValueError(
                f"topk_indices: {name} must be a power of two in [2 * next_pow2(k), {MAX_BLOCK}], got {b} (k={k})"
            )

    def launch(src, idx_in, w, blk, dst_idx, dst_key, from_keys, out_keys, final=False):
        n_chunks = (w + blk - 1) // blk
        # several segments per program can share each reduction (rows_per_program)
        seg_rows = 1 if final else (rows_per_program or DEFAULT_ROWS)
        seg_rows = min(seg_rows, next_pow2(rows * n_chunks))
        n_prog = (rows * n_chunks + seg_rows - 1) // seg_rows
        two = bool(split)
        thr = torch.empty(rows * n_chunks if two else 1, dtype=torch.int32, device=src.device)
        for phase in ((1, 2) if two else (0,)):
            launcher_of(*_TOPK)((n_prog,),
                src, idx_in if idx_in is not None else src, lengths if lengths is not None else src,
                dst_idx, dst_key if dst_key is not None else dst_idx, thr,
                rows, w, k, n_chunks, src.stride(0), idx_in.stride(0) if idx_in is not None else 0,
                dst_idx.stride(0),
                BLOCK=blk, ROWS=seg_rows, K_PAD=k_pad, FROM_KEYS=from_keys,
                HAS_LEN=lengths is not None and not from_keys, OUT_KEYS=out_keys, PHASE=phase,
                RADIX_BITS=fit_radix(radix_bits, seg_rows * blk),
                num_warps=(select_warps if phase == 2 and select_warps else None)
                or (final_warps if final else num_warps) or _warps(blk * seg_rows),
            )

    if width <= block:
        launch(logits, None, width, max(16, next_pow2(width)), out, None, False, False, final=True)
        return out
    # rounds: each chunk keeps its top-k (key, index) pairs, until the survivors fit one program
    src, idx_in, w, from_keys = logits, None, width, False
    while True:
        n_chunks = (w + block - 1) // block
        keys = torch.empty((rows, n_chunks * k), dtype=torch.int32, device=logits.device)
        idx = torch.empty_like(keys)
        launch(src, idx_in, w, block, idx, keys, from_keys, True)
        src, idx_in, w, from_keys = keys, idx, n_chunks * k, True
        if w <= final_block:
            break
    launch(src, idx_in, w, max(16, next_pow2(w)), out, None, True, False, final=True)
    return out


def sample_brackets(k: int, stride: int) -> tuple[int, int]:
    """Sample ranks (hi, lo) around the k-th key's expected rank k / stride (~4 sigma each side)."""
    r = k / stride
    d = SAMPLE_SIGMAS * math.sqrt(r) + 4
    return math.floor(r - d), math.ceil(r + d)


def sample_launch(rows: int) -> tuple[int, int]:
    """The sample select's (warps, pass tile) for `rows` rows: (SAMPLE_MANY_WARPS,
    SAMPLE_MANY_TILE) from SAMPLE_MANY_ROWS rows on, else (SAMPLE_WARPS, SAMPLE_TILE). The
    launch changes no selection."""
    return (SAMPLE_MANY_WARPS, SAMPLE_MANY_TILE) if rows >= SAMPLE_MANY_ROWS else (SAMPLE_WARPS, SAMPLE_TILE)


def sample_topk(logits: torch.Tensor, k: int, lengths: torch.Tensor | None, tile: int | None = None,
                stride: int | None = None, cap: int | None = None, num_warps: int | None = None,
                radix_bits: int | None = None, scratch_tile: int | None = None,
                narrow: bool | None = None) -> torch.Tensor:
    """The sample-bracketed select (kernels/topk/sample_kernel.py): one program a row, any width,
    any k the wrapper takes. Scratch: 2 x rows x cap int32 (cap 4096 for k <= 2048, else 16384),
    sized from the shapes alone (graph-safe). scratch_tile: 0 searches the scratch's cap keys
    in registers, a power of two >= 16 reads them in pieces of that many (the same selection);
    by default 0 while cap <= SCRATCH_KEYS_A_THREAD keys a thread of num_warps, else the tile.
    num_warps and tile default to `sample_launch(rows)` (under the interpreter: 4 warps, tiles of
    256). narrow: the scratch's k-th key found by a binary search over the bracket (lo, hi]
    alone, ceil(log2(hi - lo)) steps, not 32 (SCRATCH_NARROW by default): the same selection."""

    interp = interpreting()
    warps, default_tile = sample_launch(logits.shape[0])
    logits, out, stride, cap, tile, radix_bits, scratch_tile = _sample_plan(
        logits, k, lengths, stride, cap, tile or (None if interp else default_tile), radix_bits, scratch_tile,
        num_warps or (SAMPLE_WARPS if interp else warps))
    rows, width = logits.shape
    if rows == 0:
        return out
    r_hi, r_lo = sample_brackets(k, stride)
    ns = max(16, next_pow2((width + stride - 1) // stride))
    scratch = torch.empty((2, rows, cap), dtype=torch.int32, device=logits.device)
    launcher_of(*_SAMPLE)((rows,),
        logits, lengths if lengths is not None else logits, out, scratch[0], scratch[1],
        width, k, logits.stride(0), r_hi, r_lo,
        TILE=tile, NS=ns, STRIDE=stride, CAP=cap,
        HAS_LEN=lengths is not None, K_PAD=next_pow2(k), W_CONST=width if interpreting() else 0,
        RADIX_BITS=fit_radix(radix_bits, max(2 * ns, cap)), SCRATCH_TILE=scratch_tile,
        NARROW=SCRATCH_NARROW if narrow is None else bool(narrow),
        num_warps=num_warps or (4 if interp else warps),
    )
    return out


def _sample_plan(logits, k, lengths, stride, cap, tile, radix_bits, scratch_tile, warps):
    """The sample select's checked arguments and output: (logits with unit column stride, out,
    stride, cap, tile, radix_bits, scratch_tile)."""
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    check_device(logits, lengths)
    rows, width = logits.shape
    out = torch.empty((rows, k), dtype=torch.int32, device=logits.device)
    stride = stride or SAMPLE_STRIDE
    while (width + stride - 1) // stride > MAX_SAMPLE:
        stride *= 2
    cap = cap or (4096 if k <= 2048 else 16384)
    tile = tile or (256 if interpreting() else SAMPLE_TILE)
    for name, v in (("tile", tile), ("cap", cap)):
        if v & (v - 1) or v < 16 or v > MAX_BLOCK:
            raise ValueError(f"topk_indices: {name} must be a power of two in [16, {MAX_BLOCK}], got {v}")
    radix_bits = _radix(radix_bits, SAMPLE_RADIX_BITS)
    if scratch_tile is None:
        scratch_tile = 0 if cap <= SCRATCH_KEYS_A_THREAD * 32 * warps else tile
    if scratch_tile and (scratch_tile & (scratch_tile - 1) or scratch_tile < 16 or scratch_tile > MAX_BLOCK):
        raise ValueError(f"topk_indices: scratch_tile must be 0 or a power of two in [16, {MAX_BLOCK}], "
                         f"got {scratch_tile}")
    return logits, out, stride, cap, tile, radix_bits, scratch_tile


def segment_topk(logits: torch.Tensor, k: int, lengths: torch.Tensor | None, segment: int | None = None,
               stride: int | None = None, cap: int | None = None, num_warps: int | None = None,
               radix_bits: int | None = None, scratch_tile: int | None = None,
               narrow: bool | None = None) -> torch.Tensor:
    """The sample select with its pass split over programs of `segment` keys (segment_kernel.py):
    four launches (the bracket a row, the segments' counts, their stores, the finish a row),
    the same keys in the same order as sample_topk with the same stride and cap. Scratch:
    the candidates (2 x rows x cap int32), the brackets and the segments' counts."""
    logits, out, stride, cap, segment, radix_bits, scratch_tile = _sample_plan(
        logits, k, lengths, stride, cap, segment or (256 if interpreting() else SEGMENT_KEYS), radix_bits,
        scratch_tile, SAMPLE_WARPS)
    rows, width = logits.shape
    if rows == 0:
        return out
    r_hi, r_lo = sample_brackets(k, stride)
    ns = max(16, next_pow2((width + stride - 1) // stride))
    segs = (width + segment - 1) // segment
    dev = logits.device
    scratch = torch.empty((2, rows, cap), dtype=torch.int32, device=dev)
    br = torch.empty((rows, 2), dtype=torch.int32, device=dev)
    cnt = torch.empty((rows, segs, 4), dtype=torch.int32, device=dev)
    lens = lengths if lengths is not None else logits
    has_len = lengths is not None
    warps = num_warps or SEGMENT_WARPS
    launcher_of(*_SEGMENT["bracket"])((rows,), logits, lens, br, width, logits.stride(0), r_hi, r_lo,
                                    NS=ns, STRIDE=stride, HAS_LEN=has_len, RADIX_BITS=fit_radix(radix_bits, 2 * ns),
                                    num_warps=warps)
    for step in ("count", "scatter"):
        extra = (out, scratch[0], scratch[1], width, k) if step == "scatter" else (width,)
        consts = dict(SEG=segment, HAS_LEN=has_len)
        if step == "scatter":
            consts.update(S_PAD=max(2, next_pow2(segs)), CAP=cap)
        launcher_of(*_SEGMENT[step])((segs, rows), logits, lens, br, cnt, *extra, logits.stride(0), segs, **consts,
                                   num_warps=warps)
    launcher_of(*_SEGMENT["finish"])((rows,), logits, lens, br, cnt, out, scratch[0], scratch[1], width, k,
                                   logits.stride(0), segs, S_PAD=max(2, next_pow2(segs)),
                                   TILE=256 if interpreting() else SAMPLE_TILE, CAP=cap, HAS_LEN=has_len,
                                   K_PAD=next_pow2(k), RADIX_BITS=fit_radix(radix_bits, cap),
                                   SCRATCH_TILE=scratch_tile, NARROW=SCRATCH_NARROW if narrow is None else bool(narrow),
                                   num_warps=4 if interpreting() else SAMPLE_WARPS)
    return out
