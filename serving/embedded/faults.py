"""Planted faults: `niah serve --fault NAME[:PARAM]`, test doubles of the field's DSA bugs.

Each is a small deviation inside the path it belongs to (never a change to the answer's
text), off unless asked, attested as the fact `faults` (canonical `name:param` strings, in
the order of FAULTS) and refused by `niah gate` as a baseline (niah.attestation). One per
bug class of docs/embedded-server.md, "Planted faults":

| name | param (default) | path | what deviates |
|---|---|---|---|
| layout | N tokens (2048) | index-key read | above a context of N, keys read in a shuffled dim order |
| residue | R in 0..3 (3) | 4:1 compression | a prompt of length R mod 4 builds its blocks one token late |
| page-move | - | prefix-cache restore | pages moved at token granularity: page i to row i, not i x P |
| prefix-stale | - | prefix-cache restore | on a hit the KV pages are restored, the index-key pages not |
| topk | K (index_topk // 2) | selection | the top-k keeps K keys; the dense shortcut uses index_topk |
| rope-base | B (10000) | index-key store | index keys rotated at RoPE base B (the query: the model's) |
| decode-page | OFF (1) | paged index read | a decode step reads logical page i from table[(i + OFF) % n] |

`parse(specs, ...)` turns the flags into a Faults (ValueError, one line: an unknown name,
a bad parameter, a fault whose path is not served: residue needs --index-compress 4,
page-move and prefix-stale --prefix-cache, decode-page --page-size, all but page-move
--attention dsa; the CUDA path serves none). Pure data and arithmetic apart from
`rerope` and `shuffled` (torch, imported when called).
"""

from __future__ import annotations

from dataclasses import dataclass

FAULTS = ("layout", "residue", "page-move", "prefix-stale", "topk", "rope-base", "decode-page")
NO_PARAM = ("page-move", "prefix-stale")


@dataclass
class Faults:
    layout: int | None = None          # context above which the read layout is wrong
    residue: int | None = None         # prompt length mod 4 whose blocks shift one token
    page_move: bool = False
    prefix_stale: bool = False
    topk: int | None = None            # the k the top-k call really keeps
    rope_base: float | None = None     # the index keys' (wrong) RoPE base
    decode_page: int = 0               # block-table offset of decode reads

    def describe(self) -> list[str]:
        """Canonical `name:param` strings, FAULTS order (the attested fact)."""
        out = []
        for name in FAULTS:
            v = getattr(self, name.replace("-", "_"))
            if v is None or v is False or (name == "decode-page" and not v):
                continue
            out.append(name if v is True else f"{name}:{_num(v)}")
        return out


def _num(v) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _param(name: str, raw: str | None, default, kind=int, lo=None, hi=None):
    if raw is None or raw == "":
        return default
    try:
        v = kind(raw)
    except ValueError:
        raise ValueError(f"--fault {name}:{raw}: the parameter must be a number") from None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ValueError(f"--fault {name}:{raw}: the parameter must be in [{lo}, {hi if hi is not None else 'inf'}]")
    return v


def parse(specs: list[str], *, attention: str, index_topk: int, compress: int, prefix_cache: bool,
          page_size: int | None, device: str = "cpu") -> Faults:
    """The Faults of repeated `--fault NAME[:PARAM]` flags, checked against the paths served."""
    f = Faults()
    for spec in specs:
        name, _, raw = spec.partition(":")
        if name not in FAULTS:
            raise ValueError(f"--fault {spec}: unknown fault {name!r} (known: {', '.join(FAULTS)})")
        if name in NO_PARAM and raw:
            raise ValueError(f"--fault {spec}: {name} takes no parameter")
        if device != "cpu":
            raise ValueError(f"--fault {spec}: planted faults are served on the CPU only (--device cpu)")
        if name != "page-move" and attention != "dsa":
            raise ValueError(f"--fault {spec}: {name} lives in the indexer's path: use it with --attention dsa")
        if name == "layout":
            f.layout = _param(name, raw, 2048, lo=1)
        elif name == "residue":
            if compress != 4:
                raise ValueError(f"--fault {spec}: residue lives in the 4:1 compression: use --index-compress 4")
            f.residue = _param(name, raw, 3, lo=0, hi=3)
        elif name in ("page-move", "prefix-stale"):
            if not prefix_cache:
                raise ValueError(f"--fault {spec}: {name} lives in the prefix cache's restore: use --prefix-cache")
            setattr(f, name.replace("-", "_"), True)
        elif name == "topk":
            f.topk = _param(name, raw, max(1, index_topk // 2), lo=1)
        elif name == "rope-base":
            f.rope_base = _param(name, raw, 10000.0, kind=float, lo=1.0)
        elif name == "decode-page":
            if page_size is None:
                raise ValueError(f"--fault {spec}: decode-page lives in the paged index cache: use --page-size")
            f.decode_page = _param(name, raw, 1, lo=1)
    return f


def shuffled(dim: int):
    """The read layout of the `layout` fault: column order 0, D/2, 1, D/2 + 1, ... (the
    keys were written flat; the reader takes them as interleaved halves)."""
    import torch

    half = dim // 2
    return torch.stack([torch.arange(half), torch.arange(half, dim)], 1).reshape(-1)


def rerope(k, start: int, true_base: float, wrong_base: float):
    """k [..., T, D] post-RoPE (NeoX halves) at positions start.. -> the same keys as RoPE
    with `wrong_base` would have rotated them (plain RoPE frequencies; the angle difference
    grows with the position, 0 at position 0)."""
    import torch

    D = k.shape[-1]
    ex = torch.arange(0, D, 2, dtype=torch.float32) / D
    delta = 1.0 / (wrong_base ** ex) - 1.0 / (true_base ** ex)              # [D/2]
    ang = torch.outer(torch.arange(start, start + k.shape[-2], dtype=torch.float32), delta)
    ang = torch.cat([ang, ang], dim=-1)                                     # [T, D]
    x1, x2 = k.chunk(2, dim=-1)
    return k * ang.cos() + torch.cat([-x2, x1], dim=-1) * ang.sin()
