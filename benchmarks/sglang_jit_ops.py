"""SGLang 0.5.23's Python wrappers around its JIT kernels, lifted from its source and bound to
the modules sglang_jit_build.py compiled (or, for --smoke on a CPU, to torch stand-ins with the
same call signature: `StandIns`, written from the .cuh files; never used for evidence).

    ops = Ops(src_tree, modules)     # modules: name -> loaded tvm-ffi module (sglang_jit_build.MODULES)
    ops.k_norm_rope(key_raw, weight, bias, eps, cos_sin, pos)          indexer_k.fused_k_indexer_norm_rope
    ops.k_norm_rope_store(key_raw, cache, loc, weight, bias, eps, cos_sin, pos, 64)   ..._store
    ops.q_rope_quant(q, weights_raw, gate, cos_sin, pos)               indexer_q.fused_q_indexer_rope_first_quant
    ops.v4_store(kv, plan, norm_weight=, norm_eps=, freq_cis=, out_loc=, kvcache=, page_size=)  compress_norm_rope_store
    ops.hadamard(x, scale)                                            quantization.hadamard.hadamard_transform
    ops.act_quant(x, 128, "ue8m0")                                    act_quant_triton.act_quant (the unfused path)
    ops.topk_paged(logits, lengths, k, metadata)                      dsa_topk_backend._topk_transform_v2_paged
    ops.topk_ragged(logits, lengths, k, offsets, row_starts)          dsa_topk_backend._topk_transform_v2_ragged
    ops.plan_topk_v2(lengths)                                         dsv4.topk.plan_topk_v2
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types
import typing
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import v4_lift  # noqa: E402
from sglang_jit_build import OPS, lift  # noqa: E402

TOPK_BACKEND = "sglang.srt.layers.attention.dsa.dsa_topk_backend"
FP8_MAX = 448.0


class Ops:
    """The lifted wrappers. `modules` maps sglang_jit_build.MODULES names to loaded modules."""

    def __init__(self, src_root: Path, modules: dict, smoke: bool = False):
        self.src = v4_lift.Source(src_root)
        kvns = dict(torch=torch, enum=__import__("enum"), functools=__import__("functools"), Union=typing.Union)
        lift(self.src, f"{OPS}.attention.dsv4.kv_layout", "KVLayout", kvns)
        lift(self.src, f"{OPS}.attention.dsv4.kv_layout", "_INTERLEAVED_ENCODING", kvns)
        mod = lambda name: (lambda *args: modules[name])  # noqa: E731 - the `_jit_*_module(...)` factories
        base = dict(torch=torch, Optional=typing.Optional, Tuple=typing.Tuple, Union=typing.Union,
                    Callable=typing.Callable, cast=typing.cast, is_xpu=lambda: False, _is_xpu=False,
                    is_hip=lambda: False, is_hip_runtime=lambda: False, is_gfx95_supported=lambda: False,
                    KVLayout=kvns["KVLayout"], aiter_k_indexer_fp4_cache_write=None,  # HIP fp4 only
                    _jit_k_indexer_norm_rope_module=mod("v32_k_norm_rope"),
                    _jit_k_indexer_norm_rope_store_module=mod("v32_k_norm_rope_store"),
                    _jit_main_q_indexer_rope_first_quant_module=mod("v32_q_rope_quant"),
                    _jit_compress_norm_rope_module=mod("v4_norm_rope_store"),
                    _jit_hadamard_module=mod("hadamard"), _jit_topk_v2_module=mod("topk_v2"))
        ik, iq = f"{OPS}.attention.dsa.indexer_k", f"{OPS}.attention.dsa.indexer_q"
        cmp_, topk = f"{OPS}.attention.dsv4.compress", f"{OPS}.attention.dsv4.topk"
        self.k_norm_rope = lift(self.src, ik, "fused_k_indexer_norm_rope", dict(base))
        self.k_norm_rope_store = lift(self.src, ik, "fused_k_indexer_norm_rope_store", dict(base))
        self.q_rope_quant = lift(self.src, iq, "fused_q_indexer_rope_first_quant", dict(base))
        self.v4_store = lift(self.src, cmp_, "compress_norm_rope_store", dict(base))
        self.DecodePlan = v4_lift.lift(self.src, v4_lift.CMP, "CompressorDecodePlan", v4_lift.base_ns())
        self.PrefillPlan = v4_lift.lift(self.src, v4_lift.CMP, "CompressorPrefillPlan", v4_lift.base_ns())
        had = dict(base)
        lift(self.src, f"{OPS}.quantization.hadamard", "_hadamard_transform_impl", had)
        self.hadamard = lift(self.src, f"{OPS}.quantization.hadamard", "hadamard_transform", had)
        tk = dict(base)
        lift(self.src, topk, "_PLAN_METADATA_INTS_PER_BATCH", tk)
        for name in ("plan_topk_v2", "topk_transform_ragged_v2", "topk_transform_paged_v2"):
            lift(self.src, topk, name, tk)
        self.plan_topk_v2 = tk["plan_topk_v2"]
        self.topk_paged = lift(self.src, TOPK_BACKEND, "_topk_transform_v2_paged", dict(tk))
        self.topk_ragged = lift(self.src, TOPK_BACKEND, "_topk_transform_v2_ragged", dict(tk))
        self.act_quant = _import_file(self.src, f"{OPS}.quantization.act_quant_triton").act_quant
        if smoke:  # _hadamard_transform_impl refuses CPU tensors
            self.hadamard = lambda x, scale=1.0: StandIns.hadamard_torch(x, scale)


def _import_file(src: v4_lift.Source, module: str):
    """Import one self-contained SGLang file (torch + triton only) as a standalone module: Triton
    reads a @triton.jit kernel's source from its file, so it cannot be exec'd from a string."""
    path = Path(src.path) / (module.replace(".", "/") + ".py")
    spec = importlib.util.spec_from_file_location("sglang_lifted_" + module.rsplit(".", 1)[1], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------
# CPU stand-ins (--smoke only): the kernels' arithmetic in torch, same call signatures.


def rope_first(x: torch.Tensor, cos_sin: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """V3.2 RoPE on dims 0..63 in interleaved pairs (2p, 2p+1) with cos_sin[pos, p] / [pos, 32 + p],
    fp32 (indexer_k.cuh load_rope_first_cos_sin). x [..., 128] fp32, pos broadcast over x[..., :]."""
    c, s = cos_sin[pos.long(), :32], cos_sin[pos.long(), 32:]
    while c.dim() < x.dim():
        c, s = c.unsqueeze(-2), s.unsqueeze(-2)
    re, im = x[..., 0:64:2], x[..., 1:64:2]
    out = x.clone()
    out[..., 0:64:2], out[..., 1:64:2] = re * c - im * s, re * s + im * c
    return out


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + eps) * w + b


def quant_rows(x: torch.Tensor):
    """Per-row fp8 as the fused kernels do: scale = max(1e-4, amax) / 448, e4m3(x * (1 / scale))."""
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-4) / FP8_MAX
    return (x * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale.squeeze(-1)


def write_fp8_pages(cache: torch.Tensor, loc: torch.Tensor, k8: torch.Tensor, scale: torch.Tensor, page: int = 64):
    """SGLang's index-K page: page*128 fp8 bytes, then page fp32 scales (fused_store_index_cache.cuh)."""
    pg, off = loc.long() // page, loc.long() % page
    rows = (pg * cache.shape[1] + off * 128)[:, None] + torch.arange(128, device=cache.device)
    cache.view(-1)[rows.flatten()] = k8.view(torch.uint8).flatten()
    srow = (pg * cache.shape[1] + page * 128 + off * 4)[:, None] + torch.arange(4, device=cache.device)
    cache.view(-1)[srow.flatten()] = scale.float().contiguous().view(torch.uint8).flatten()


class StandIns:
    """Modules with the compiled modules' functions, computed with torch (CPU smoke runs)."""

    @staticmethod
    def hadamard_torch(x: torch.Tensor, scale: float) -> torch.Tensor:
        n = x.shape[-1]
        return (x.float() @ (hadamard_matrix(n, torch.float32, x.device) * math.sqrt(n)) * scale).to(x.dtype)

    @classmethod
    def modules(cls) -> dict:
        def k_norm_rope(k_input, k_out, weight, bias, cos_sin, pos, eps):
            k_out.copy_(rope_first(layer_norm(k_input.float(), weight, bias, eps), cos_sin, pos).to(k_out.dtype))

        def k_norm_rope_store(k_input, cache, loc, weight, bias, cos_sin, pos, eps):
            x = rope_first(layer_norm(k_input.float(), weight, bias, eps), cos_sin, pos)
            write_fp8_pages(cache, loc, *quant_rows(x.to(k_input.dtype).float()))

        def q_rope_quant(q_input, q_fp8, weight, weights_out, weight_scale, cos_sin, pos):
            q8, scale = quant_rows(rope_first(q_input.float(), cos_sin, pos))
            q_fp8.copy_(q8)
            weights_out.copy_((weight.float() * weight_scale * scale)[..., None])

        def v4_store(kv, plan, weight, eps, freqs, out_loc, kvcache, is_decode, ratio):
            from niah.kernels.v4_store.reference import ref_store_v4_index_keys

            ref_store_v4_index_keys(kv, plan, is_decode, ratio, weight, eps, freqs, out_loc, kvcache, "fp8", 64)

        def topk_paged(scores, lens, table, out, page_size, metadata, raw=None):
            for b in range(scores.shape[0]):
                n, k = int(lens[b]), out.shape[1]
                sel = scores[b, :n].topk(min(k, n)).indices if n else scores.new_zeros(0, dtype=torch.long)
                out[b].fill_(-1)
                out[b, : sel.numel()] = (table[b, sel // page_size] * page_size + sel % page_size).int()

        def topk_ragged(scores, lens, starts, offsets, out):
            for b in range(scores.shape[0]):
                s0, n, k = int(starts[b]) if starts is not None else 0, int(lens[b]), out.shape[1]
                sel = scores[b, s0 : s0 + n].topk(min(k, n)).indices
                out[b].fill_(-1)
                out[b, : sel.numel()] = (sel + offsets[b]).int()

        ns = types.SimpleNamespace
        return {"v32_k_norm_rope": ns(forward=k_norm_rope), "v32_k_norm_rope_store": ns(forward=k_norm_rope_store),
                "v32_q_rope_quant": ns(forward=q_rope_quant), "v4_norm_rope_store": ns(forward=v4_store),
                "hadamard": ns(hadamard_transform=lambda x, out, s: out.copy_(cls.hadamard_torch(x, s))),
                "topk_v2": ns(topk_plan=lambda lens, meta, thr: None, topk_transform_paged=topk_paged,
                              topk_transform_ragged=topk_ragged)}


def hadamard_matrix(n: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """Sylvester Hadamard / sqrt(n) (what hadamard_transform(x, n ** -0.5) computes)."""
    h = torch.ones(1, 1, dtype=dtype, device=device)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h / math.sqrt(n)
