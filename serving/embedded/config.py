"""The embedded server's configuration (`niah serve`'s options): `ServeConfig`.

`describe()` is what /v1/models, /server_info and the ready line show: the attention and,
where set, the paths a request runs through (device, RoPE scaling, the indexer's settings,
the paged index cache's page size, chunked prefill, the prefix cache, 4:1 index
compression, planted faults). `max_model_len` caps the context served; describe() leaves it
out because the server reports it as its own `max_model_len` beside these. Pure data: the CLI
and the matrix read it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServeConfig:
    attention: str = "dense"
    index_dtype: str = "fp8"
    index_topk: int = 512
    window: int = 0
    query_chunk: int = 512
    threads: int = 2
    index_rotation: str = "none"
    device: str = "cpu"             # "cpu" or "cuda[:N]" (serving/embedded/device.py)
    rope_scaling: str = "none"      # "none" or "yarn" (context x rope_factor)
    rope_factor: float = 4.0
    bf16_read: str = "fused"        # CUDA, bf16 keys: "fused" (kernels) or "gather" (the naive read)
    topk_impl: str = "niah"         # CUDA: "niah" (bundled top-k) or "torch"
    cuda_graphs: bool = True        # CUDA: decode steps replayed from CUDA graphs (cuda/graphs.py)
    index_query_dtype: str = "fp32"  # CPU: the index query's precision (precision.py: fp32, bf16, fp8)
    rescore_factor: int = 4         # CPU, two-stage index dtypes: c*k candidates re-scored
    page_size: int | None = None    # CPU: the paged index-key cache's page (tokens); None = flat
    prefill_chunk: int | None = None  # CPU: chunked prefill (tokens a forward pass); None = one pass
    prefix_cache: bool = False      # CPU: reuse an earlier request's prefix pages (needs page_size)
    index_compress: int = 1         # CPU: 4 = V4-style 4:1 index compression; 1 = off
    faults: tuple[str, ...] = ()    # CPU: planted faults (faults.py), `name[:param]`
    max_model_len: int | None = None  # the context served (prompt + generated); None = the model's own

    def describe(self) -> dict:
        d = {"attention": self.attention}
        if self.device != "cpu":
            d["device"] = self.device
        if self.rope_scaling != "none":
            d.update(rope_scaling=self.rope_scaling, rope_factor=self.rope_factor)
        if self.attention == "dsa":
            d.update(index_dtype=self.index_dtype, index_rotation=self.index_rotation, index_topk=self.index_topk,
                     window=self.window, query_chunk=self.query_chunk)
            if self.device == "cpu":
                d["index_query_dtype"] = self.index_query_dtype
                if "+" in self.index_dtype:
                    d["rescore_factor"] = self.rescore_factor
            if self.index_compress > 1:
                d["index_compress"] = self.index_compress
            if self.device != "cpu":
                d["topk"] = self.topk_impl
                if self.index_dtype == "bf16":
                    d["bf16_read"] = self.bf16_read
        for key in ("page_size", "prefill_chunk"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.prefix_cache:
            d["prefix_cache"] = True
        if self.faults:
            d["faults"] = list(self.faults)
        return d
