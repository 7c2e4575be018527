"""The three gates of benchmarks/detection.py, each against a running server.

- `sweep` + `judge_field`: niah's recommended CI gate (docs/ci.md): `niah sweep --coverage
  field --cache-state warm` (RECOMMENDED) on the baseline's server and on the candidate's,
  then `niah gate --metric both` (RECOMMENDED_GATE: the answers, and the indexer probe's
  needle rank, needle kept and selection fidelity); caught = exit 1. Extra sweep options
  (the smoke mode's smaller grid) are passed through.
- `vllm_niah`: a reimplementation of vLLM's `tests/evals/niah` as the field notes describe
  it: lengths (4K-32K there; here the caller's, scaled to the model), depths 0/25/50/75/100,
  3 trials, raw /v1/completions with no chat template, one repeated filler sentence, an
  unseeded random 7-digit needle, substring scoring; the gate passes at >= 0.70 overall.
  Absolute: it needs no baseline run (caught = below 0.70).
- `short_check`: what a GSM8K-style gate sees: short needle prompts whose whole context
  stays within index_topk (no selection ever happens), scored like vLLM's; it passes at
  >= the fault-free server's accuracy minus 0.05 (a threshold set from a reference run, as
  the engines set theirs).

Each returns a dict: score (the short check's; it and the field gate are judged by the
caller against the reference), passed (vLLM's, absolute), trials, seconds, client_cpu_s (the
CPU seconds of the niah processes it ran, or of the calling thread for the in-process
gates, so arms that run side by side in threads are counted apart). The server's CPU is
counted by the caller. Nothing here starts a server.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = " What is the special magic number? The special magic number is"
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
VLLM_PASS = 0.70
RECOMMENDED = ("--coverage", "field", "--cache-state", "warm")   # docs/ci.md: the per-change gate
RECOMMENDED_GATE = ("--metric", "both")                           # its judge, on a server with the probe


def niah_cli(*args: str) -> tuple[int, str, float]:
    """`python -m niah ARGS`: (exit code, its output, the CPU seconds it used)."""
    proc = subprocess.Popen([sys.executable, "-m", "niah", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, out, usage.ru_utime + usage.ru_stime


def sweep(url: str, out: Path, extra: list[str]) -> float:
    """The recommended sweep against url into out (extra: options beside it); its CPU seconds."""
    rc, text, cpu = niah_cli("sweep", "--endpoint", url, *RECOMMENDED, "--out", out, "--quiet", *extra)
    if rc != 0:
        raise RuntimeError(f"niah sweep failed ({rc}): {text.strip()[-400:]}")
    return cpu


def judge_field(base_run: Path, run: Path) -> dict:
    """`niah gate` of a candidate's run against the baseline's: passed (exit 0), its first line,
    its CPU seconds."""
    rc, text, cpu = niah_cli("gate", "--baseline", base_run, "--candidate", run, *RECOMMENDED_GATE)
    if rc not in (0, 1):
        raise RuntimeError(f"niah gate ({rc}): {text.strip()[-400:]}")
    return {"passed": rc == 0, "verdict": (text.strip().splitlines() or [""])[0][:200], "cpu_s": cpu}


def _tokens(client: httpx.Client, url: str, text: str) -> int:
    return int(client.post(url.removesuffix("/v1") + "/tokenize", json={"prompt": text}).json()["count"])


def needle_prompt(client: httpx.Client, url: str, n_tokens: int, depth: float, needle: str) -> str:
    """One repeated filler sentence to about n_tokens, the needle at `depth` of its sentences."""
    per = _tokens(client, url, FILLER * 8) / 8
    fixed = _tokens(client, url, f" The special magic number is {needle}." + QUESTION)
    reps = max(1, int((n_tokens - fixed) / per))
    at = round(reps * depth)
    return FILLER * at + f"The special magic number is {needle}. " + FILLER * (reps - at) + QUESTION


def probe(client: httpx.Client, url: str, length: int, depth: float, rng: random.Random) -> bool:
    needle = str(rng.randint(1_000_000, 9_999_999))
    body = {"prompt": needle_prompt(client, url, length, depth, needle), "max_tokens": 12, "temperature": 0}
    r = client.post(url + "/completions", json=body)
    r.raise_for_status()
    return needle in r.json()["choices"][0]["text"].replace(",", "").replace(" ", "")


def vllm_niah(url: str, lengths: list[int], trials: int = 3, rng: random.Random | None = None) -> dict:
    """vLLM's NIAH eval (module doc): passed at >= 0.70 of len(lengths) x 5 x trials probes."""
    rng = rng or random.Random()              # unseeded, as vLLM's needle
    t0, c0 = time.perf_counter(), time.thread_time()
    with httpx.Client(timeout=900) as client:
        hits = [probe(client, url, n, d, rng) for n in lengths for d in DEPTHS for _ in range(trials)]
    score = sum(hits) / len(hits)
    return {"passed": score >= VLLM_PASS, "score": score, "trials": len(hits), "seconds": time.perf_counter() - t0,
            "client_cpu_s": time.thread_time() - c0}


def short_check(url: str, index_topk: int, n: int, seed: int = 0) -> dict:
    """Short prompts (context within index_topk): their accuracy (the verdict, against the
    reference's, is the caller's)."""
    rng = random.Random(seed)
    t0, c0 = time.perf_counter(), time.thread_time()
    length = index_topk - 16                 # prompt + 12 generated tokens stay within k
    if length < 24:
        raise ValueError(f"index_topk {index_topk} leaves no room for a short prompt below it (>= 40 needed)")
    with httpx.Client(timeout=600) as client:
        hits = [probe(client, url, length, DEPTHS[i % len(DEPTHS)], rng) for i in range(n)]
    score = sum(hits) / len(hits)
    return {"score": score, "trials": n,
            "seconds": time.perf_counter() - t0, "client_cpu_s": time.thread_time() - c0, "length": length}
