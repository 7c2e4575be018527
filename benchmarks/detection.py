"""Which gate catches which planted fault, at what cost: the detection benchmark (CPU).

    python benchmarks/detection.py [--faults all | NAME[:P],...] [--repeats 5] [--index-topk 128]
        [--vllm-lengths 1024,2048,4096,8192] [--short-n 20] [--gates field,vllm,short]
        [--out results/detection] [--smoke]

For every planted fault of the embedded server (`niah serve --fault`, docs/embedded-server.md)
three gates run against the fault-free server of the same serving paths as baseline
(benchmarks/detection_gates.py): (a) niah's CI gate (`niah sweep --coverage field`, then
`niah gate`), (b) a reimplementation of vLLM's NIAH eval (5 depths x 3 trials per length,
pass at >= 0.70), (c) a short-context check below the sparse regime (what a GSM8K-style gate
sees). Then `--repeats` fault-free servers go through the same gates: the false alarms.

Servers: `niah serve --attention dsa --index-dtype fp8 --index-topk K --page-size 16
--prefix-cache` (the paths every fault but one lives in); the residue fault's arm adds
`--index-compress 4 --window 128`, and has its own fault-free baseline. Each server is a
fresh process on a free loopback port, stopped by SIGTERM.

Out (OUT/): `results.jsonl` (one line per server and gate: fault or null, repeat, passed,
caught, score, trials, seconds, cpu_s = the server's CPU seconds plus the clients'),
`table.md` (the table docs/ci.md quotes) and `command.txt` (the command that made them).
`--smoke` runs the machinery on a tiny grid (top-k 64, the topk fault, one repeat, one
300-token length, few probes): it checks that the benchmark works, and measures nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import detection_gates as gates  # noqa: E402 - beside this file

FAULTS = ("layout", "residue", "page-move", "prefix-stale", "topk", "rope-base", "decode-page")
PAGE = 16


def paths(fault: str | None) -> tuple[str, ...]:
    """The serving paths of a fault's arm (and of its fault-free baseline)."""
    return ("--index-compress", "4", "--window", "128") if fault and fault.startswith("residue") else ()


class Server:
    """`niah serve FLAGS` on a free loopback port until stop(); cpu_s() its CPU seconds so far."""

    def __init__(self, flags: list[str], timeout: float = 300):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        self.proc = subprocess.Popen([sys.executable, "-m", "niah", "serve", *flags, "--host", "127.0.0.1",
                                      "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ready, self.lines = threading.Event(), []

        def pump():
            for line in self.proc.stdout:
                self.lines.append(line)
                ready.set() if "ready on" in line else None

        threading.Thread(target=pump, daemon=True).start()
        t0 = time.monotonic()
        while not ready.is_set() and self.proc.poll() is None and time.monotonic() - t0 < timeout:
            time.sleep(0.2)
        if not ready.is_set():
            self.stop()
            raise RuntimeError("niah serve did not start: " + "".join(self.lines[-5:]).strip())

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _client_cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_gates(server: Server, args, label: str, base: dict) -> list[dict]:
    """Every asked gate against one server; base: the fault-free reference (run folder, short score)."""
    out = []
    for gate in args.gates:
        c0, s0 = _client_cpu(), server.cpu_s()
        if gate == "field":
            folder = args.out / "runs" / label
            if base.get("run") is None:           # the reference itself: its sweep is the baseline
                t0 = time.perf_counter()
                gates.sweep(server.url, folder, args.field_extra)
                base["run"] = folder
                res = {"passed": True, "trials": sum(1 for _ in (folder / "trials.jsonl").open()),
                       "seconds": time.perf_counter() - t0, "reference": True}
            else:
                res = gates.field_gate(base["run"], server.url, folder, args.field_extra)
        elif gate == "vllm":
            res = gates.vllm_niah(server.url, args.vllm_lengths, args.vllm_trials)
        else:
            res = gates.short_check(server.url, args.index_topk, args.short_n, base.get("short"))
            if base.get("short") is None:
                base["short"] = res["score"] - 0.05
                res["reference"] = True
        res.update(gate=gate, caught=not res["passed"], cpu_s=round(server.cpu_s() - s0 + _client_cpu() - c0, 1))
        out.append(res)
    return out


def arm(args, group: tuple[str, ...], fault: str | None, repeat: int, base: dict) -> list[dict]:
    """One server (the group's paths, with `fault` or fault-free) through every gate."""
    flags = ["--attention", "dsa", "--index-dtype", "fp8", "--index-topk", str(args.index_topk),
             "--page-size", str(PAGE), "--prefix-cache", "--threads", str(args.threads), *group]
    if fault:
        flags += ["--fault", fault]
    label = f"{fault or 'none'}{''.join(group).replace('-', '')}-{repeat}".replace(":", "_")
    server = Server(flags)
    try:
        rows = run_gates(server, args, label, base)
    finally:
        server.stop()
    for r in rows:
        r.update(fault=fault, repeat=repeat, server=" ".join(flags), reference=r.get("reference", False))
        print(json.dumps(r), flush=True)
    return rows


def table(rows: list[dict], gates_asked: list[str]) -> str:
    """The Markdown table: per fault, each gate's verdict, trials and CPU minutes; then false alarms."""
    head = "| fault | " + " | ".join(f"{g}: caught (trials, CPU min)" for g in gates_asked) + " |"
    lines = [head, "|---|" + "---|" * len(gates_asked)]
    for fault in dict.fromkeys(r["fault"] for r in rows if r["fault"]):
        cells = []
        for g in gates_asked:
            r = next(x for x in rows if x["fault"] == fault and x["gate"] == g)
            cells.append(f"{'**yes**' if r['caught'] else 'no'} ({r['trials']}, {r['cpu_s'] / 60:.1f})")
        lines.append(f"| `{fault}` | " + " | ".join(cells) + " |")
    clean = [r for r in rows if r["fault"] is None and not r.get("reference")]
    alarms = [f"{g}: {sum(r['caught'] for r in clean if r['gate'] == g)} of "
              f"{sum(1 for r in clean if r['gate'] == g)}" for g in gates_asked]
    return "\n".join(lines) + "\n\nFalse alarms over fault-free servers: " + "; ".join(alarms) + "\n"


def parse(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--faults", default="all", help="all, or a comma list of NAME[:PARAM] (niah serve --fault)")
    ap.add_argument("--repeats", type=int, default=5, help="fault-free servers gated for false alarms")
    ap.add_argument("--index-topk", type=int, default=128)
    ap.add_argument("--vllm-lengths", default="1024,2048,4096,8000", help="vLLM's 4K-32K scaled to 8K tokens")
    ap.add_argument("--vllm-trials", type=int, default=3)
    ap.add_argument("--short-n", type=int, default=20, help="probes of the short-context check")
    ap.add_argument("--gates", default="field,vllm,short")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("results/detection"))
    ap.add_argument("--smoke", action="store_true", help="a tiny grid: the machinery works, nothing is measured")
    args = ap.parse_args(argv)
    args.field_extra = []
    if args.smoke:
        args.index_topk, args.repeats, args.vllm_trials, args.short_n = 64, 1, 1, 4
        args.vllm_lengths = "300"
        args.faults = "topk" if args.faults == "all" else args.faults
        args.field_extra = ["--lengths", "300", "--depths", "50"]
    args.gates = [g for g in args.gates.split(",") if g]
    bad = [g for g in args.gates if g not in ("field", "vllm", "short")]
    if bad or not args.gates:
        ap.error(f"--gates takes field, vllm, short (not {', '.join(bad) or 'nothing'})")
    args.faults = list(FAULTS) if args.faults == "all" else [f for f in args.faults.split(",") if f]
    unknown = [f for f in args.faults if f.split(":")[0] not in FAULTS]
    if unknown:
        ap.error(f"unknown fault(s) {', '.join(unknown)} (known: {', '.join(FAULTS)})")
    args.vllm_lengths = [int(x) for x in str(args.vllm_lengths).split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "command.txt").write_text("python benchmarks/detection.py " + " ".join(argv or sys.argv[1:]) + "\n")
    rows: list[dict] = []
    for group in dict.fromkeys(paths(f) for f in args.faults):    # one fault-free reference per set of paths
        base: dict = {"run": None, "short": None}
        for repeat in range(args.repeats + 1):                     # repeat 0 is the reference
            rows += arm(args, group, None, repeat, base)
        for fault in (f for f in args.faults if paths(f) == group):
            rows += arm(args, group, fault, 0, base)
    with (args.out / "results.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    md = table(rows, args.gates)
    (args.out / "table.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
