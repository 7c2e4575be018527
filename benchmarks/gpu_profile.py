"""Where one long trial's time goes on the GPU server, per arm: the real generation loop
(serving/embedded/generate.py: prefill with the needle and indexer probe, then greedy decode
with the probe on), wall time split into prefill / decode steps / host, and torch.profiler's
tables of the prefill and of a few decode steps (kernel time on the device, launches, CPU
time). No HTTP: the server's work on one request.

    python benchmarks/gpu_profile.py --tokens 22600 --arms dense,fp8-k512,bf16-k512,bf16-gather-k512 \
        --out profile-dir

Arms as serving/embedded/cuda/bench.py names them. Prompts are random token ids; the value
span never appears in the answer, so the probe stays on for every decode step (the worst case
of a real trial, where it stays on until the value is written).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx")


def _table(prof, sort: str, rows: int = 18) -> str:
    return prof.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=60)


def main(argv: list[str] | None = None) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from niah.serving.embedded import weights
    from niah.serving.embedded.cuda.bench import arm_config, arm_kernels, check_arms
    from niah.serving.embedded.device import build_model, warm_up
    from niah.serving.embedded.generate import generate

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=22600)
    ap.add_argument("--arms", default="dense,fp8-k512,bf16-k512,bf16-gather-k512")
    ap.add_argument("--decode", type=int, default=24)
    ap.add_argument("--profile-steps", type=int, default=4)
    ap.add_argument("--out", default="profile-out")
    a = ap.parse_args(argv)
    check_arms(a.arms.split(","), "cuda")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    loaded = weights.load()
    tok = loaded.tokenizer
    n = a.tokens
    span = (n // 2, n // 2 + 8)
    summary = []
    for arm in a.arms.split(","):
        with arm_kernels(arm):
            cfg = arm_config(arm, "cuda")
            t0 = time.perf_counter()
            model = build_model(cfg, loaded)
            warm_up(model, cfg.index_topk)
            ready = time.perf_counter() - t0
            ids = torch.randint(0, model.args.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()

            def run(max_tokens: int, model=model):
                return generate(model, lambda t: tok.decode(t), ids, max_tokens, set(), needle_positions=span,
                                value=(span, "999999999"))

            run(2)                                   # this length's kernels compiled
            torch.cuda.synchronize()
            walls = []
            for _ in range(2):
                torch.cuda.synchronize()
                t1 = time.perf_counter()
                run(1)                               # prefill (+ its probe) only
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                g = run(a.decode + 1)
                torch.cuda.synchronize()
                t3 = time.perf_counter()
                walls.append((t2 - t1, (t3 - t2) - (t2 - t1), g.completion_tokens))
            pre, dec, steps = min(walls)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pp:
                run(1)
                torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pd:
                run(a.profile_steps + 1)
                torch.cuda.synchronize()
            ev_p = pp.key_averages()
            dev_p = sum(e.self_device_time_total for e in ev_p) / 1e3
            launches_p = sum(e.count for e in ev_p if e.key in LAUNCHES)
            ev_d = pd.key_averages()
            dev_d = sum(e.self_device_time_total for e in ev_d) / 1e3
            launches_d = sum(e.count for e in ev_d if e.key in LAUNCHES)
            row = {"arm": arm, "tokens": n, "ready_s": round(ready, 2), "prefill_wall_s": round(pre, 4),
                   "decode_wall_ms_per_step": round(1000 * dec / max(1, steps - 1), 2), "decode_steps": steps - 1,
                   "prefill_device_ms": round(dev_p, 1), "prefill_launches": launches_p,
                   "profiled_run_device_ms(prefill+%d steps)" % a.profile_steps: round(dev_d, 1),
                   "profiled_run_launches": launches_d,
                   "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}
            summary.append(row)
            print(json.dumps(row), flush=True)
            (out / f"{arm}.txt").write_text(
                f"{json.dumps(row)}\n\n== prefill, by device time\n{_table(pp, 'self_cuda_time_total')}\n"
                f"== prefill, by CPU time\n{_table(pp, 'self_cpu_time_total')}\n"
                f"== prefill + {a.profile_steps} decode steps, by device time\n{_table(pd, 'self_cuda_time_total')}\n"
                f"== prefill + {a.profile_steps} decode steps, by CPU time\n{_table(pd, 'self_cpu_time_total')}\n")
            print(_table(pp, "self_cuda_time_total", 10), flush=True)
            del model
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
