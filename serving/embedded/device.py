"""Where the embedded model runs: the CPU (default) or a CUDA GPU, and what it is built of.

`check_device(name)` is the CLI edge's check ("cpu", "cuda" or "cuda:N"; BadInput when no
GPU is there). `build_model(cfg, loaded)` makes the Transformer on cfg.device with its
attention: dense, the CPU emulation (dsa.DSA) or, on CUDA, the bundled kernels
(cuda.indexer.CudaDSA), with the RoPE scaling asked for, and on CUDA its decode graphs
(cuda.graphs.DecodeGraphs, unless cfg.cuda_graphs is False; attested as the fact `decode`)
and, for sparse attention on CUDA, its prefill chunk (`model.prefill_chunk` = cfg.query_chunk
tokens a forward pass: generate.prefill; attested as the fact `prefill_chunk`, null for one pass).
On the CPU, the serving paths of `niah serve`'s options: the index-key cache flat or paged
(`page_size`, index_cache.py), chunked prefill (`prefill_chunk`), the prefix cache
(`model.prefix_cache`, prefix.py), 4:1 index compression (compress.py) and planted faults
(faults.py); `serving_facts(cfg, model)` is what the server attests of them (the CUDA
path: its fixed pages of 64, no prefix cache, no faults).
`warm_up(model)` compiles the GPU kernels once before the server says it is ready (one
sequence long enough for selection, two eager decode steps, one captured graph's replay).
"""

from __future__ import annotations

from niah.errors import BadInput
from niah.serving.embedded import faults

DEVICES = ("cpu", "cuda")


def check_device(name: str) -> str:
    base, _, index = name.partition(":")
    if base not in DEVICES or (index and (base != "cuda" or not index.isdigit())):
        raise BadInput(f"--device must be cpu, cuda or cuda:N, not {name!r}")
    if base == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BadInput(f"--device {name}: no CUDA GPU is available to torch here")
        if index and int(index) >= torch.cuda.device_count():
            raise BadInput(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return name


def build_model(cfg, loaded):
    """The Transformer of ServeConfig cfg, weights `loaded`, attention installed."""
    import torch

    from niah.serving.embedded.dsa import DSA  # noqa: PLC0415 (imports torch; the CLI edge checks --device without it)
    from niah.serving.embedded.model import Transformer  # noqa: PLC0415 (imports torch, as above)

    from niah.serving.embedded.prefix import PrefixCache  # noqa: PLC0415 (as above)

    cuda = cfg.device.startswith("cuda")
    flt = faults.parse(list(cfg.faults), attention=cfg.attention, index_topk=cfg.index_topk,
                       compress=cfg.index_compress, prefix_cache=cfg.prefix_cache, page_size=cfg.page_size,
                       device=cfg.device)
    if cuda and ":" in cfg.device:
        torch.cuda.set_device(torch.device(cfg.device))
    model = Transformer.from_loaded(loaded, device=cfg.device, rope_scaling=cfg.rope_scaling,
                                    rope_factor=cfg.rope_factor)
    attention = None
    if cfg.attention == "dsa" and cuda:
        from niah.serving.embedded.cuda.indexer import CudaDSA  # noqa: PLC0415 (imports torch; CUDA only)

        a = model.args
        attention = CudaDSA(a.n_layer, a.n_local_heads, a.head_dim, a.block_size, cfg.index_dtype, cfg.index_topk,
                            cfg.query_chunk, cfg.index_rotation, cfg.bf16_read, cfg.topk_impl, cfg.device)
    elif cfg.attention == "dsa":
        attention = DSA(cfg.index_dtype, cfg.index_topk, cfg.window, cfg.query_chunk, rotation=cfg.index_rotation,
                        query_dtype=cfg.index_query_dtype, rescore_factor=cfg.rescore_factor,
                        keys=_index_keys(cfg, model.args, flt), compress=cfg.index_compress, faults=flt,
                        rope_base=model.args.rope_base)
    model.set_attention(attention)
    # generate.prefill: the sparse arms' prompt in chunks on the GPU; dense runs one causal pass
    # (its fused causal kernel: 0.69 s at 22.6K tokens on the H200; chunked under a mask, once, 1.05 s).
    # On the CPU, chunked where --prefill-chunk asks.
    model.prefill_chunk = (cfg.query_chunk if attention is not None else None) if cuda else cfg.prefill_chunk
    model.faults = flt
    model.prefix_cache = (PrefixCache(cfg.page_size, page_move=flt.page_move, stale_index=flt.prefix_stale)
                          if cfg.prefix_cache and not cuda else None)
    model.decode_graphs = None
    if cuda and getattr(cfg, "cuda_graphs", True):
        from niah.serving.embedded.cuda.graphs import DecodeGraphs  # noqa: PLC0415 (imports torch; CUDA only)

        model.decode_graphs = DecodeGraphs(model, attention)
    if cuda:
        from niah.serving.sglang import attest  # noqa: PLC0415 (as the imports above)

        attest.set_facts(decode="cuda-graphs" if model.decode_graphs is not None else "eager",
                         prefill_chunk=model.prefill_chunk)
    return model


def _index_keys(cfg, args, flt):
    """The CPU indexer's index-key cache: paged at cfg.page_size tokens (a page of P / 4
    block keys under 4:1 compression), else flat (index_cache.py)."""
    from niah.serving.embedded.index_cache import FlatKeys, PagedKeys  # noqa: PLC0415 (imports torch)

    if cfg.page_size is None:
        return FlatKeys()
    forms = 2 if "+" in cfg.index_dtype else 1
    r = cfg.index_compress
    return PagedKeys(args.n_layer, args.n_local_heads, args.head_dim, -(-args.block_size // r), cfg.page_size // r,
                     forms, decode_page_offset=flt.decode_page)


def serving_facts(cfg, model) -> dict:
    """The attested facts of the serving paths of `model` (built by build_model from cfg):
    page size, prefill chunk, prefix cache, index compression (sparse arms), planted faults
    (always, [] for none)."""
    if cfg.device.startswith("cuda"):
        return {"prefix_cache": False, "faults": [], **({"page_size": 64} if cfg.attention == "dsa" else {})}
    out = {"page_size": cfg.page_size, "prefill_chunk": cfg.prefill_chunk, "prefix_cache": cfg.prefix_cache,
           "faults": model.faults.describe()}
    if cfg.attention == "dsa":
        out["index_compress"] = cfg.index_compress
    return out


def warm_up(model, topk: int) -> None:
    """Compile the GPU path's kernels: a prefill past top-k (many rows) and two decode steps."""
    import torch

    n = min(model.args.block_size - 4, max(2 * topk + 100, 1200))
    ids = torch.randint(0, model.args.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    model(ids, 0)
    model(ids[:, -1:], n)
    model(ids[:, -2:-1], n + 1)
    graphs = getattr(model, "decode_graphs", None)
    if graphs is not None:                       # one graph captured and replayed: a capture failure stops the start
        graphs.step(int(ids[0, 0]), n + 2)
    torch.cuda.synchronize()
