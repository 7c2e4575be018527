"""Hand-written run folders for the report / gate / compare tests (documented format)."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any, Callable

from niah.runs.trials import RunStore
from niah.runs.manifest import write_manifest

Outcome = Callable[[str, int, float, int, random.Random], str]


def always(outcome: str) -> Outcome:
    return lambda cfg, length, depth, trial, rng: outcome


def rate(p: float) -> Outcome:
    return lambda cfg, length, depth, trial, rng: "correct" if rng.random() < p else "wrong"


def prompt_hash(length: int, depth: float, trial: int, seed: int) -> str:
    return hashlib.sha256(f"{length}|{depth:g}|{trial}|{seed}".encode()).hexdigest()


def make_run(
    path: Path,
    configs: dict[str, dict[str, Any]] | None = None,
    lengths=(1024, 2048, 4096),
    depths=(0.0, 50.0, 100.0),
    trials: int = 4,
    outcome: Outcome | dict[str, Outcome] = always("correct"),
    seed: int = 0,
    model: str = "test-model",
    selection: bool = False,
    skip: Callable[[str, int, float, int], bool] | None = None,
    created: str = "2026-11-29T08:00:00Z",
) -> Path:
    """Write manifest.json + trials.jsonl. `outcome(config, length, depth, trial, rng)`
    decides each trial's outcome (one function, or one per configuration); the prompt hash
    depends on (length, depth, trial, seed) only, so configurations pair up."""
    configs = configs or {"default": {}}
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_manifest(path, {
        "niah_version": "0.1.0", "git_sha": "abc123", "created": created, "command": ["niah", "sweep"],
        "args": {"lengths": list(lengths), "depths": list(depths), "trials": trials, "seed": seed},
        "configs": {n: {"endpoint": "http://x", "model": model, "engine": "external", "axes": axes}
                    for n, axes in configs.items()},
    })
    rng = random.Random(seed)
    with RunStore(path).open(resume=True) as store:
        for cfg in configs:
            fn = outcome[cfg] if isinstance(outcome, dict) else outcome
            for length in lengths:
                for depth in depths:
                    for t in range(trials):
                        if skip and skip(cfg, length, depth, t):
                            continue
                        s = seed * 1_000_003 + length * 131 + int(depth) * 7 + t
                        out = fn(cfg, length, depth, t, rng)
                        err = out == "error"
                        store.append({
                            "config": cfg, "model": model, "length": length,
                            "prompt_tokens": None if err else length + (t % 3) - 1,
                            "prompt_tokens_local": length, "depth": depth, "depth_achieved": depth,
                            "trial": t, "seed": s, "prompt_sha256": prompt_hash(length, depth, t, s),
                            "needle": "4829163", "needle_key": "Lisbon",
                            "answer": "4829163" if out == "correct" else "",
                            "reasoning": None, "correct": out == "correct", "outcome": out,
                            "finish_reason": None if err else ("length" if out == "truncated" else "stop"),
                            "completion_tokens": None if err else 8,
                            "latency_s": None if err else 0.1 + length / 10000,
                            "ttft_s": None if err else 0.05 + length / 20000,
                            "error": "HTTP 503: server died" if err else None, "attempts": 3 if err else 1,
                            "selection_recall": ([1.0, max(0.0, 0.9 - length / 40960), 0.95]
                                                 if selection and not err else None),
                            "finished_at": created,
                        })
    return path
