"""Helpers of the serving-path and fault tests: a real model built as `niah serve` builds it,
greedy generation through generate.generate, and every selection the indexer made.

`Run.selections` maps (layer, position) -> the positions that query row kept (a tuple),
read from the masks the DSA hands its attention: the same rows whatever the chunking,
so a chunked, paged or prefix-hit run compares with the plain one row by row. Their fixtures
`path_weights` (the real weights) and `path_tok` are in this folder's conftest.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
TEXT = ("The lighthouse keeper wrote every evening about the weather, the ships and the gulls. "
        "On Tuesday the fog came in early and the bell rang for hours. ")
QUESTION = " What is the secret number? The secret number is"


def prompt(secret: str, before: int = 3, after: int = 1, lead: str = "") -> str:
    return lead + TEXT * before + f"The secret number is {secret}. " + TEXT * after + QUESTION


@dataclass
class Run:
    text: str
    selections: dict = field(default_factory=dict)     # (layer, position) -> kept positions
    prefix_hit: int = 0
    scores: dict = field(default_factory=dict)         # (layer, position) -> (lowest kept score, index scores)


def build(loaded, **cfg):
    from niah.serving.embedded.config import ServeConfig
    from niah.serving.embedded.device import build_model

    base = dict(attention="dsa", index_dtype="fp8", index_topk=16, query_chunk=32)
    return build_model(ServeConfig(**{**base, **cfg}), loaded)


def generate(model, tok, text: str | list[int], max_tokens: int = 3) -> Run:
    """Greedy generation of `text` (or ids), recording every selection."""
    from niah.serving.embedded import generate as gen

    ids = tok.encode(text, add_special_tokens=False).ids if isinstance(text, str) else list(text)
    dsa = model.attention_impl
    out: dict = {}
    ties: dict = {}
    attend = dsa._attend if dsa is not None else None

    def record(qc, cache, mask, o):
        C, Sc = mask.shape
        scores = dsa._sum.view(-1)[:C * Sc].view(C, Sc) if dsa.compress == 1 else None   # keep_mask's bufs[2]
        for c in range(C):
            kept = tuple((mask[c] == 0).nonzero().squeeze(1).tolist())
            out[(cache.layer_id, Sc - C + c)] = kept
            if scores is not None:
                row = scores[c, :Sc - C + c + 1]
                ties[(cache.layer_id, Sc - C + c)] = float(row[list(kept)].min()), row.clone()
        attend(qc, cache, mask, o)

    if dsa is not None:
        dsa._attend = record
    hits = {}
    real_prefill = gen.prefill

    def prefill(*a, **kw):
        logits, stats = real_prefill(*a, **kw)
        hits["m"] = stats.get("prefix_hit", 0)
        return logits, stats

    gen.prefill = prefill
    try:
        g = gen.generate(model, lambda x: tok.decode(x, skip_special_tokens=True), ids, max_tokens, set())
    finally:
        gen.prefill = real_prefill
        if dsa is not None:
            dsa._attend = attend
    return Run(g.text, out, hits.get("m", 0), ties)


def differing(a: dict, b: dict, keys=None) -> list:
    """The (layer, position) rows both runs selected for (or `keys`) whose selections differ."""
    keys = sorted(set(a) & set(b)) if keys is None else keys
    return [k for k in keys if a[k] != b[k]]


def tie_broken(a: Run, b: Run, keys, tol: float = 1e-4) -> list:
    """Of the rows whose selections differ, those that differ by more than a tie at the cut:
    a key kept by one run only whose score is not within `tol` (relative) of that run's
    lowest kept score. torch.topk breaks exact ties (ReLU zeros) as its input's shape leads
    it to, and fp32 sums taken in another order move a score by ~1e-6."""
    bad = []
    for key in differing(a.selections, b.selections, keys):
        for run, other in ((a, b), (b, a)):
            low, row = run.scores[key]
            extra = set(run.selections[key]) - set(other.selections[key])
            if any(abs(float(row[p]) - low) > tol * max(abs(low), 1.0) for p in extra):
                bad.append(key)
                break
    return bad


def ids_of(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids
