"""Layout constants: the source text the plugin relies on (fp8 rows of 132 bytes = 128 values
+ one 4-byte scale, 8,448-byte pages of 64 tokens, quant block 128, uint8 container), as
data (`LAYOUT`), and every place the DSA/V4 sources write the fp8 row width (132, 8448,
`head_dim + 4`, `head_dim // block * 4`, `scan_layout`), each of which must be one of them.
A constant holds for the releases it names (none: every supported one): 0.5.16 sizes the
rows in `DSATokenToKVPool._index_buffer_shape` and `_compute_cell_size` (no IndexKeyCache, no
`_compute_dsa_indexer_cell_size`, no index_kpool) and lacks the pooled, ROCm-gfx950,
page-interleave and torch-fallback sources 0.5.23 pins.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from niah.serving.sglang.contract.sites import (LAYOUT_SCOPE, ROW_NUMBERS, ROW_WIDTH, Site, _enclosing, _LAYOUT_TEXT,
                                                _scopes)
from niah.serving.sglang.contract.scan_cache import cached_scan
from niah.serving.sglang.releases import NEWEST


@dataclass(frozen=True)
class LayoutConstant:
    """Source text (normalised by ast.unparse) that `module.qualname` must contain."""

    module: str
    qualname: str
    expect: str
    why: str
    versions: tuple[str, ...] = ()

    @property
    def file(self) -> str:
        return self.module.replace(".", "/") + ".py"


_MP = "sglang.srt.mem_cache.memory_pool"
_DSA = "sglang.srt.layers.attention.dsa"
_V4IDX = "sglang.srt.layers.attention.dsv4.indexer"
_ROW = "fp8 row: 128 values + one 4-byte scale = 132 bytes"
_NOT_NIAH = "pinned so that a change shows; niah does not run this path"
_NEW, _OLD = ("0.5.23",), ("0.5.16",)
LAYOUT: tuple[LayoutConstant, ...] = (
    LayoutConstant(_MP, "DSATokenToKVPool.quant_block_size", "quant_block_size = 128",
                   "quant block: one fp32 scale per 128-value key"),
    LayoutConstant(_MP, "DSATokenToKVPool.index_k_with_scale_buffer_dtype",
                   "index_k_with_scale_buffer_dtype = torch.uint8", "the key cache is a uint8 byte container"),
    LayoutConstant(_MP, "DSATokenToKVPool.__init__", "self.index_page_size = self.page_size // index_kpool",
                   "index pages hold page_size // index_kpool tokens (64 with index_kpool 1)", _NEW),
    LayoutConstant(_MP, "DSATokenToKVPool.__init__", "assert index_head_dim == 128", "128-dim index keys"),
    LayoutConstant("sglang.srt.mem_cache.index_key_cache", "IndexKeyCache._buffer_shape",
                   "pool.page_size // pool.index_kpool * (pool.index_head_dim + "
                   "pool.index_head_dim // pool.quant_block_size * 4)",
                   "fp8 row bytes: 64 x (128 values + 4 scale bytes) = 8,448", _NEW),
    LayoutConstant("sglang.srt.model_executor.pool_configurator",
                   "DefaultPoolConfigurator._compute_dsa_indexer_cell_size",
                   "index_head_dim + index_head_dim // DSATokenToKVPool.quant_block_size * 4",
                   "memory accounting: 132 bytes a token, which niah turns into 256", _NEW),
    LayoutConstant("sglang.srt.model_executor.pool_configurator", "HybridSWAPoolConfigurator.__init__",
                   "index_head_dim + index_head_dim // DSATokenToKVPool.quant_block_size * 4",
                   f"SWA-hybrid memory accounting: the {_ROW} (the hybrid pool's DSA keys)", _NEW),
    LayoutConstant(f"{_DSA}.dsa_indexer", "Indexer._get_topk_paged", "get_page_table_64()",
                   "decode reads 64-token pages"),
    LayoutConstant(f"{_DSA}.dsa_indexer", "Indexer._get_topk_paged", "head_dim_with_sf = 132",
                   f"decode views the pages as [pages, 64, 1, 132]: the {_ROW} (niah replaces this for bf16)"),
    LayoutConstant(f"{_DSA}.dsa_indexer", "Indexer._store_index_k_cache", "buf.view(-1, page_size, 132)",
                   f"the store views pages as [pages, 64, 132]: the {_ROW} (niah replaces this for bf16)"),
    LayoutConstant(f"{_DSA}.dsa_indexer", "Indexer._aiter_fused_fp8_prepare_and_store",
                   "self.head_dim + 4", f"ROCm aiter store: the {_ROW}; {_NOT_NIAH}", _NEW),
    LayoutConstant(f"{_DSA}.dsa_indexer_kpool", "IndexerKPool._get_topk_paged", "head_dim_with_sf = 132",
                   f"pooled keys (index_kpool > 1, refused): the {_ROW}; {_NOT_NIAH}", _NEW),
    LayoutConstant(f"{_DSA}.kpool_fp8_index", "all_gather_and_scatter_pool_slots", "payload_bytes = head_dim + 4",
                   f"pooled keys (index_kpool > 1, refused): the {_ROW}; {_NOT_NIAH}", _NEW),
    LayoutConstant(f"{_DSA}.gfx950_fused_indexer", "CACHE_TOK_STRIDE", "CACHE_TOK_STRIDE = 132",
                   f"ROCm gfx950 fused indexer: the {_ROW}; {_NOT_NIAH}", _NEW),
    LayoutConstant(f"{_DSA}.utils", "fp8_mqa_logits_make_fused_kv", "per_token_size = head_dim + 4",
                   f"prefill's fused key view: the {_ROW}"),
    LayoutConstant(f"{_DSA}.utils", "_fp8_paged_mqa_logits_torch",
                   "per_token_work_bytes = 2 * (head_dim + 4) + 2 * head_dim + 4",
                   f"SGLang's torch fallback sizes its work from the {_ROW}", _NEW),
    LayoutConstant(_V4IDX, "fp8_paged_mqa_logits_torch",
                   "assert kvcache_fp8.shape[1:] == (block_size, 1, head_dim + 4)",
                   f"V4 paged logits (niah replaces it in niah arms): the {_ROW}"),
    LayoutConstant(_V4IDX, "fp8_paged_mqa_logits_torch", "total_dim = block_size * (head_dim + 4)",
                   f"V4 paged logits (niah replaces it in niah arms): 64 x the {_ROW}"),
    LayoutConstant(_V4IDX, "fp8_paged_mqa_logits_torch_sm120",
                   "assert kvcache_fp8.shape[1:] == (block_size, 1, head_dim + 4)",
                   f"V4 paged logits on sm120 (niah replaces it in niah arms): the {_ROW}"),
    LayoutConstant(_V4IDX, "fp8_paged_mqa_logits_torch_sm120",
                   "kvcache_flat = kvcache_fp8.view(-1, block_size * (head_dim + 4))",
                   f"V4 paged logits on sm120 (niah replaces it in niah arms): 64 x the {_ROW}"),
    LayoutConstant(_V4IDX, "C4IndexerBackendMixin.forward_c4_indexer",
                   "head_dim_with_sf = 68 if use_fp4_indexer else 132",
                   f"the V4 C4 indexer views pages with the {_ROW} (fp4: 68)"),
    LayoutConstant("sglang.srt.mem_cache.deepseek_v4_memory_pool", "get_dsv4_indexer_bytes_per_token",
                   "return index_head_dim + index_head_dim // 128 * 4",
                   f"V4 pool accounting: the {_ROW}, which niah doubles for bf16", _NEW),
    LayoutConstant("sglang.srt.mem_cache.page_interleave", "_page_shard_row_bytes",
                   "kv_dim * kv_size + index_head_dim + index_head_dim // 128 * 4",
                   f"page-interleave pools (refused): the {_ROW}; {_NOT_NIAH}", _NEW),
    LayoutConstant("sglang.srt.mem_cache.pool_host.dsa", "dsa_indexer_bytes_per_token_per_layer",
                   "elems = index_head_dim + index_head_dim // quant_block_size * 4",
                   f"HiCache host pool (refused): the {_ROW}; {_NOT_NIAH}", _NEW),
    LayoutConstant(_MP, "DSATokenToKVPool._index_buffer_shape",
                   "self.page_size * (self.index_head_dim + self.index_head_dim // self.quant_block_size * 4)",
                   "fp8 row bytes: 64 x (128 values + 4 scale bytes) = 8,448 (niah replaces this for bf16)", _OLD),
    LayoutConstant("sglang.srt.model_executor.pool_configurator", "DefaultPoolConfigurator._compute_cell_size",
                   "index_head_dim + index_head_dim // DSATokenToKVPool.quant_block_size * 4",
                   "memory accounting: 132 bytes a token, which niah turns into 256", _OLD),
    LayoutConstant("sglang.srt.mem_cache.memory_pool_host", "DSAIndexerPoolHost.__init__",
                   "self.index_head_dim + self.index_head_dim // self.indexer_quant_block_size * 4",
                   f"HiCache host pool (refused): the {_ROW}; {_NOT_NIAH}", _OLD),
    LayoutConstant("sglang.srt.mem_cache.deepseek_v4_memory_pool", "DeepSeekV4IndexerPool.get_bytes_per_token",
                   "self.index_head_dim + 4", f"V4 pool (refused on 0.5.16): the {_ROW}; {_NOT_NIAH}", _OLD),
    LayoutConstant("sglang.srt.model_executor.pool_configurator", "DSV4PoolConfigurator._get_bytes_per_full_token",
                   "self.indexer_head_dim + self.indexer_head_dim // quant_block_size * 4",
                   f"V4 accounting (refused on 0.5.16): the {_ROW}; {_NOT_NIAH}", _OLD),
)


def scan_layout(rel: str, text: str) -> list[Site]:
    """Every place a LAYOUT_SCOPE file writes the fp8 row width: the numbers 132 or 8448,
    or an expression of the form `head_dim + 4` / `head_dim // block * 4` (outermost)."""
    if not rel.startswith(LAYOUT_SCOPE) or not _LAYOUT_TEXT.search(text):
        return []
    tree = ast.parse(text)
    scopes = sorted(_scopes(tree.body, constants=True))
    out, inside = [], set()
    for node in ast.walk(tree):  # parents first: an outer matching expression covers the inner ones
        if id(node) in inside:
            continue
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value in ROW_NUMBERS:
            expr = str(node.value)
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult))
              and ROW_WIDTH.search(expr := ast.unparse(node))):
            inside.update(id(n) for n in ast.walk(node))
        else:
            continue
        enclosing = _enclosing(scopes, node.lineno)
        out.append(Site(rel, node.lineno, enclosing[-1] if enclosing else "", expr))
    return sorted(out, key=lambda s: s.line)


def _normal(text: str) -> str:
    return " ".join(text.split())


def layout_of(release: str = NEWEST) -> tuple[LayoutConstant, ...]:
    """The layout constants that hold for `release`."""
    return tuple(c for c in LAYOUT if not c.versions or release in c.versions)


def check_layout(source, files: dict[str, str] | None = None, release: str = NEWEST) -> list[str]:
    """A problem "file:line: ..." for every layout constant of `release` the source no longer
    states, and for every place the source writes the fp8 row width that no constant covers."""
    problems = []
    constants = layout_of(release)
    for c in constants:
        sym = source.lookup(c.module, c.qualname)
        if sym is None:
            problems.append(f"{c.module}.{c.qualname}: missing (layout constant: {c.why})")
        elif _normal(c.expect) not in _normal(sym.text):
            problems.append(f"{sym.where or c.module}: layout changed: {c.module}.{c.qualname} no longer says "
                            f"`{c.expect}` ({c.why})")
    for rel in sorted(files or {}):
        for s in cached_scan("layout", scan_layout, rel, files[rel], Site):
            if not any(c.file == s.file and c.qualname == s.where and _normal(s.callee) in _normal(c.expect)
                       for c in constants):
                problems.append(f"{s.file}:{s.line}: new layout constant: {s.where or '<module>'} writes the fp8 "
                                f"row width as `{s.callee}`, which the contract does not know")
    return problems
