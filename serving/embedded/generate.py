"""Greedy generation as small functions: prefill, decode one token, stop checks.

Runs on one model at a time (the server serialises calls). Text is produced by decoding
all generated ids each step and emitting the new suffix, holding back what may still turn
into a stop string or an incomplete UTF-8 character.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from niah.serving.embedded.cuda.memory import PEAKS
from niah.serving.embedded.probe import ProbeLog


@dataclass
class Generation:
    text: str = ""
    completion_tokens: int = 0
    finish_reason: str = "length"
    selection_recall: list[float | None] | None = None
    indexer: dict | None = None      # the probe's detail (probe.ProbeLog.detail); None under dense
    token_ids: list[int] = field(default_factory=list)


def prefill(model, ids: list[int], needle_positions: tuple[int, int] | None = None,
            probe=None) -> tuple[torch.Tensor, dict]:
    """Run the prompt; -> (logits of the last position [V], stats).

    A model with `prefill_chunk` (build_model sets it: the GPU server's sparse arms, and
    `--prefill-chunk` on the CPU) takes the prompt that many tokens at a time (chunked
    prefill, as SGLang's `--chunked-prefill-size`), so its activations do not grow with the
    prompt; the needle and the probe are recorded by the last chunk (the last prompt token's
    selection). The same causal attention as in one pass: each chunk attends to the cache
    the chunks before it wrote. A model with `prefix_cache` (prefix.py) first restores the
    longest page-aligned prefix an earlier request saved and prefills from there (stats
    `prefix_hit`: the positions restored); the attention's `begin_request` starts the request."""
    stats: dict = {}
    if needle_positions is not None:
        stats["needle_positions"] = needle_positions
    if probe is not None:
        stats["probe"] = probe
    peaks = PEAKS if model.device.type == "cuda" else None   # peak GPU memory per prompt length
    if peaks is not None:
        peaks.begin()
    begin = getattr(getattr(model, "attention_impl", None), "begin_request", None)
    if begin is not None:
        begin(len(ids))
    prefix = getattr(model, "prefix_cache", None)
    m = prefix.restore(model, ids) if prefix is not None else 0
    chunk = getattr(model, "prefill_chunk", None) or len(ids)
    for c0 in range(m, len(ids), chunk):
        last = c0 + chunk >= len(ids)
        logits = model(torch.tensor([ids[c0:c0 + chunk]]), c0, stats=stats if last else None)   # [1, 1, V]
    if peaks is not None:
        peaks.end(len(ids))
    if prefix is not None:
        prefix.save(model, ids)
    stats["prefix_hit"] = m
    return logits[0, -1], stats


def decode_one(model, token: int, pos: int, probe=None) -> torch.Tensor:
    """Feed one token at position pos; -> logits [V]. On a GPU with decode graphs
    (cuda/graphs.py) the step is a graph replay where the graphs serve it, its logits on
    the host (one wait a step); else on the model's device."""
    graphs = getattr(model, "decode_graphs", None)
    if graphs is not None:
        logits = graphs.step(token, pos, probe)
        if logits is not None:
            return logits
    stats = {"decode": True, **({"probe": probe} if probe is not None else {})}   # a decode step, not a prefill
    return model(torch.tensor([[token]]), pos, stats=stats)[0, -1]


def greedy(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits))


def selection_recall(model, stats: dict) -> list[float | None] | None:
    """Per layer: share of the needle's tokens kept for the last prompt token. None under
    dense attention (nothing is selected); a layer that recorded nothing is None, never 1.0."""
    if model.attention_name == "dense":
        return None
    got = stats.get("selection_recall", {})
    vals = [got.get(i) for i in range(model.args.n_layer)]
    on_device = [i for i, v in enumerate(vals) if isinstance(v, torch.Tensor)]
    if on_device:                         # the layers' device scalars: one copy, not one sync each
        for i, v in zip(on_device, torch.stack([vals[i] for i in on_device]).tolist()):
            vals[i] = v
    return [None if v is None else float(v) for v in vals]


def prefill_to_host(logits: torch.Tensor, stats: dict, probe) -> torch.Tensor:
    """The prefill's device results (the last logits, each layer's selection recall and probe
    stats) copied to the host by ONE copy, so reading them waits once and queues no GPU work
    after the wait (a wait that six servers sharing a card pay at its next turn; `generate`
    calls it for a GPU prefill); put back in place as host tensors of their dtypes and
    shapes. -> the host logits."""
    recall = stats.get("selection_recall", {})
    slots = [("logits", None, logits)]
    slots += [("recall", i, v) for i, v in recall.items() if isinstance(v, torch.Tensor)]
    if probe is not None:
        slots += [("probe", i, v) for i, v in probe.current.items() if isinstance(v, torch.Tensor)]
    flat = torch.cat([v.reshape(-1).to(torch.float64) for _, _, v in slots]).cpu()   # float64 holds fp32 exactly
    at = 0
    for kind, i, v in slots:
        host = flat[at:at + v.numel()].view(v.shape).to(v.dtype)
        at += v.numel()
        if kind == "logits":
            logits = host
        elif kind == "recall":
            recall[i] = host
        else:
            probe.current[i] = host
    return logits


def new_probe(model, value_positions: tuple[int, int] | None):
    """A ProbeLog for this request, or None (not asked, or dense attention)."""
    if value_positions is None or model.attention_name == "dense":
        return None
    topk = model.layers[0].attention.attend.topk
    return ProbeLog(value_positions, model.args.n_layer, topk)


def _value_done(text: str, value: str) -> bool:
    """The answer's digits so far contain the value (separators ignored)."""
    return bool(value) and value in "".join(ch for ch in text if ch.isdigit())


def _stop_cut(text: str, stops: list[str]) -> int | None:
    """Index where the earliest stop string starts in text, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _holdback(text: str, stops: list[str]) -> int:
    """How many trailing chars may still be the start of a stop string (or a broken char)."""
    n = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                n = max(n, k)
                break
    if text.endswith("\ufffd"):
        n = max(n, 1)
    return n


def generate(model, decode: Callable[[list[int]], str], ids: list[int], max_tokens: int,
             eos_ids: set[int], stops: list[str] | None = None,
             needle_positions: tuple[int, int] | None = None,
             value: tuple[tuple[int, int], str] | None = None,
             on_text: Callable[[str], None] | None = None,
             cancelled: Callable[[], bool] | None = None) -> Generation:
    """Greedy decoding of up to max_tokens after the prompt ids.

    decode: token ids -> text. on_text(piece) receives the text as it becomes final.
    Stops at an eos id or a stop string (finish_reason "stop"; the stop string is not
    returned), or after max_tokens ("length").
    value: (token span, text) of the needle's value: the indexer probe records the last
    prompt token and every decode step until the answer's digits hold the value."""
    stops = [s for s in (stops or []) if s]
    out = Generation()
    probe = new_probe(model, value[0] if value else None)
    logits, stats = prefill(model, ids, needle_positions, probe)
    if logits.is_cuda:
        logits = prefill_to_host(logits, stats, probe)
    if needle_positions is not None:
        out.selection_recall = selection_recall(model, stats)
    if probe is not None:
        probe.next_step()
    done = False
    sent = 0                                                    # chars already handed to on_text
    pos = len(ids)
    while out.completion_tokens < max_tokens:
        tok = greedy(logits)
        out.completion_tokens += 1
        if tok in eos_ids:
            out.finish_reason = "stop"
            break
        out.token_ids.append(tok)
        text = decode(out.token_ids)
        cut = _stop_cut(text, stops)
        if cut is not None:
            out.text, out.finish_reason = text[:cut], "stop"
            break
        out.text = text
        done = done or (probe is not None and _value_done(text, value[1]))
        ready = len(text) - _holdback(text, stops)
        if on_text and ready > sent:
            on_text(text[sent:ready])
            sent = ready
        if out.completion_tokens >= max_tokens or (cancelled and cancelled()):
            break
        logits = decode_one(model, tok, pos, None if done else probe)
        if probe is not None and not done:
            probe.next_step()
        pos += 1
    if on_text and len(out.text) > sent:
        on_text(out.text[sent:])
    if probe is not None:
        out.indexer = probe.detail(_value_done(out.text, value[1]))
    return out
