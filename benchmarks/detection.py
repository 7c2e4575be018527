"""Which gate catches which planted fault, at what cost: the detection benchmark (CPU).

    python benchmarks/detection.py [--faults all | NAME[:P],...] [--repeats 5] [--index-topk 128]
        [--context 2048] [--vllm-lengths auto] [--vllm-trials 3] [--short-n 20]
        [--gates field,vllm,short] [--repeat-gates field,vllm,short] [--jobs 1] [--threads 2]
        [--out results/detection] [--smoke]
    python benchmarks/detection.py --table RESULTS.jsonl[:GATES] [RESULTS.jsonl[:GATES] ...] --out DIR

For every planted fault of the embedded server (`niah serve --fault`, docs/embedded-server.md)
three gates run against the fault-free server of the same serving paths as baseline
(benchmarks/detection_gates.py): (a) niah's recommended CI gate (`niah sweep --coverage
field --cache-state warm`, then `niah gate`), (b) a reimplementation of vLLM's NIAH eval (5
depths x 3 trials per length, pass at >= 0.70; its 4K-32K lengths scaled to the served
context: `auto` = context x 1/8, 1/4, 1/2, 1), (c) a short-context check below the sparse
regime (what a GSM8K-style gate sees). Then `--repeats` fault-free servers of the plain
paths go through `--repeat-gates`: the false alarms. The plain paths' reference runs even
when no fault of them is asked.

Servers: `niah serve --attention dsa --index-dtype fp8 --index-topk K --page-size 16
--prefix-cache --max-model-len CONTEXT` (the paths every fault but one lives in); the residue
fault's arm adds `--index-compress 4 --window 128`, and has its own fault-free baseline. Each
server is a fresh process on a free loopback port, stopped by SIGTERM. With `--jobs N`
the arms run N at a time (references included: every verdict is judged after all arms
ran), each server pinned to its own `--threads` cores (a 2-core machine's share on a
larger host).

Out (OUT/): `results.jsonl` (one line per server and gate: fault or null, repeat, passed,
caught, score, trials, seconds, cpu_s = the server's CPU seconds plus its clients'),
`measured.jsonl` (each arm's rows as it finishes, before any verdict: an arm that fails is
one line and exit 1, and what the others measured stays there), `table.md` (the table
docs/ci.md quotes, which names the faults with their parameters), `host.json` (cores, CPU
model) and `command.txt`
(the command that made them). `--table R1 R2 ...` only writes the table of results made
in several runs (on several hosts: each run judged its arms against its own references);
`R:vllm,short` takes only those gates' rows of R (a gate measured again elsewhere).
`--smoke` runs the machinery on a tiny grid (top-k 64, the topk fault, one repeat, one
300-token length, few probes): it checks that the benchmark works, and measures nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import platform
import os
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

    def __init__(self, flags: list[str], timeout: float = 300, cpus: set[int] | None = None):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        self.proc = subprocess.Popen([sys.executable, "-m", "niah", "serve", *flags, "--host", "127.0.0.1",
                                      "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if cpus:                  # pinned before it loads the model (its torch threads start then)
            os.sched_setaffinity(self.proc.pid, cpus)
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


def measure(server: Server, args, label: str, asked: list[str]) -> list[dict]:
    """Every asked gate's measurement against one server (the verdicts come later, from judge)."""
    out = []
    for gate in asked:
        s0 = server.cpu_s()
        if gate == "field":
            folder = args.out / "runs" / label
            t0 = time.perf_counter()
            cpu = gates.sweep(server.url, folder, args.field_extra)
            res = {"run": str(folder.relative_to(args.out)), "trials": sum(1 for _ in (folder / "trials.jsonl").open()),
                   "seconds": time.perf_counter() - t0, "client_cpu_s": cpu}
        elif gate == "vllm":
            res = gates.vllm_niah(server.url, args.vllm_lengths, args.vllm_trials)
        else:
            res = gates.short_check(server.url, args.index_topk, args.short_n)
        res.update(gate=gate, cpu_s=server.cpu_s() - s0 + res.pop("client_cpu_s"))
        out.append(res)
    return out


def judge(rows: list[dict], out: Path) -> None:
    """Each row's verdict against its group's reference (repeat 0, fault-free): the field gate by
    `niah gate` (its CPU counted with the row), the short check against the reference's score
    minus 0.05; the vLLM eval is absolute (>= 0.70)."""
    refs = {(r["group"], r["gate"]): r for r in rows if r["reference"]}
    for r in rows:
        ref = refs[(r["group"], r["gate"])]
        if r["reference"] and r["gate"] != "vllm":
            r["passed"] = True
        elif r["gate"] == "field":
            res = gates.judge_field(out / ref["run"], out / r["run"])
            r.update(passed=res["passed"], verdict=res["verdict"], cpu_s=r["cpu_s"] + res["cpu_s"])
        elif r["gate"] == "short":
            r["passed"] = r["score"] >= ref["score"] - 0.05
        r.update(caught=not r["passed"], cpu_s=round(r["cpu_s"], 1), seconds=round(r["seconds"], 1))


def arm(args, group: tuple[str, ...], fault: str | None, repeat: int, cpus: set[int] | None = None) -> list[dict]:
    """One server (the group's paths, with `fault` or fault-free) through its gates' measurements."""
    flags = ["--attention", "dsa", "--index-dtype", "fp8", "--index-topk", str(args.index_topk),
             "--page-size", str(PAGE), "--prefix-cache", "--max-model-len", str(args.context),
             "--threads", str(args.threads), *group]
    if fault:
        flags += ["--fault", fault]
    label = f"{fault or 'none'}{''.join(group).replace('-', '')}-{repeat}".replace(":", "_")
    server = Server(flags, cpus=cpus)
    asked = args.repeat_gates if fault is None and repeat > 0 else args.gates
    try:
        rows = measure(server, args, label, asked)
    finally:
        server.stop()
    for r in rows:
        r.update(fault=fault, repeat=repeat, group=" ".join(group), reference=fault is None and repeat == 0,
                 server=" ".join(flags))
        print(json.dumps(r), flush=True)
    return rows


def table(rows: list[dict], gates_asked: list[str]) -> str:
    """The Markdown table: per fault, each gate's verdict, trials, wall and CPU minutes; then the
    false alarms of each gate over the fault-free repeats."""
    head = "| fault | " + " | ".join(f"{g}: caught (trials, min, CPU min)" for g in gates_asked) + " |"
    # each set of paths' fault-free reference (repeat 0); the vLLM-style gate is absolute, so a
    # catch of it where it fails that reference too is no detection
    refs = {(r.get("group", ""), r["gate"]): r for r in rows if r["fault"] is None and r["repeat"] == 0}
    lines = [head, "|---|" + "---|" * len(gates_asked)]
    for fault in dict.fromkeys(r["fault"] for r in rows if r["fault"]):
        cells = []
        for g in gates_asked:
            r = next((x for x in rows if x["fault"] == fault and x["gate"] == g), None)
            verdict = "not run" if r is None else "**yes**" if r["caught"] else "no"
            ref = None if r is None else refs.get((r.get("group", ""), g))
            if r is not None and g == "vllm" and ref is not None and ref["caught"]:   # it fails that server too
                verdict = "yes, but its fault-free server fails too" if r["caught"] else verdict
            cells.append(verdict if r is None else
                         f"{verdict} ({r['trials']}, {r['seconds'] / 60:.1f}, {r['cpu_s'] / 60:.1f})")
        lines.append(f"| `{fault}` | " + " | ".join(cells) + " |")
    # a fault-free reference is a fault-free run of the absolute gate (vLLM's) too
    clean = [r for r in rows if r["fault"] is None and (r["repeat"] > 0 or r["gate"] == "vllm")]
    alarms = [f"{g}: {sum(r['caught'] for r in clean if r['gate'] == g)} of "
              f"{sum(1 for r in clean if r['gate'] == g)}" for g in gates_asked]
    return "\n".join(lines) + "\n\nFalse alarms over fault-free servers: " + "; ".join(alarms) + "\n"


def vllm_lengths(text: str, context: int) -> list[int]:
    """`auto`: vLLM's 4K, 8K, 16K and 32K scaled to the context (the last one leaves room for the
    question and 12 answer tokens); else a comma list."""
    if text == "auto":
        return [context // 8, context // 4, context // 2, context - 32]
    return [int(x) for x in text.split(",")]


def parse(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--faults", default="all", help="all, or a comma list of NAME[:PARAM] (niah serve --fault)")
    ap.add_argument("--repeats", type=int, default=5, help="fault-free servers gated for false alarms")
    ap.add_argument("--index-topk", type=int, default=128)
    ap.add_argument("--context", type=int, default=2048, help="the servers' --max-model-len")
    ap.add_argument("--vllm-lengths", default="auto", help="auto (vLLM's 4K-32K scaled to the context) or a list")
    ap.add_argument("--vllm-trials", type=int, default=3)
    ap.add_argument("--short-n", type=int, default=20, help="probes of the short-context check")
    ap.add_argument("--gates", default="field,vllm,short")
    ap.add_argument("--repeat-gates", default=None, help="the gates of the fault-free repeats (default: --gates)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=1,
                    help="arms at a time (references included), each server pinned to its own --threads cores")
    ap.add_argument("--out", type=Path, default=Path("results/detection"))
    ap.add_argument("--smoke", action="store_true", help="a tiny grid: the machinery works, nothing is measured")
    ap.add_argument("--table", nargs="+", metavar="RESULTS[:GATES]",
                    help="only write the table of these results.jsonl files (runs on several hosts) to --out; "
                         "FILE:vllm,short takes only those gates' rows of FILE")
    args = ap.parse_args(argv)
    args.field_extra = []
    if args.smoke:
        args.index_topk, args.repeats, args.vllm_trials, args.short_n = 64, 1, 1, 4
        args.vllm_lengths = "300"
        args.faults = "topk" if args.faults == "all" else args.faults
        args.field_extra = ["--lengths", "300", "--depths", "50", "--residues", "4:0"]
    known = ("field", "vllm", "short")
    args.gates = [g for g in args.gates.split(",") if g]
    args.repeat_gates = args.gates if args.repeat_gates is None else [g for g in args.repeat_gates.split(",") if g]
    bad = [g for g in args.gates + args.repeat_gates if g not in known]
    if bad or not args.gates:
        ap.error(f"--gates and --repeat-gates take field, vllm, short (not {', '.join(bad) or 'nothing'})")
    if not set(args.repeat_gates) <= set(args.gates):
        ap.error("--repeat-gates must be among --gates (a repeat is gated against the reference's runs)")
    # all: every fault at its default, but layout's length at half the context (its default 2,048
    # would leave no longer prompt to see it in a smaller context)
    args.faults = ([f"layout:{args.context // 2}" if f == "layout" else f for f in FAULTS] if args.faults == "all"
                   else [f for f in args.faults.split(",") if f])
    unknown = [f for f in args.faults if f.split(":")[0] not in FAULTS]
    if unknown:
        ap.error(f"unknown fault(s) {', '.join(unknown)} (known: {', '.join(FAULTS)})")
    cores = sorted(os.sched_getaffinity(0))
    if args.jobs < 1 or args.threads < 1:
        ap.error("--jobs and --threads must be at least 1")
    if args.jobs > 1 and args.jobs * args.threads > len(cores):
        ap.error(f"--jobs {args.jobs} x --threads {args.threads} needs {args.jobs * args.threads} cores; "
                 f"this process may use {len(cores)}")
    args.cores = cores
    if not 64 <= args.context <= 8192:
        ap.error(f"--context must be 64..8192 (the model's context), not {args.context}")
    if "short" in args.gates and args.index_topk < 40:
        ap.error(f"--index-topk {args.index_topk} leaves the short check no prompt below it (>= 40 needed)")
    try:
        args.vllm_lengths = vllm_lengths(str(args.vllm_lengths), args.context)
    except ValueError:
        ap.error(f"--vllm-lengths takes auto or a comma list of token counts, not {args.vllm_lengths!r}")
    if any(not 32 <= n <= args.context - 16 for n in args.vllm_lengths):
        ap.error(f"--vllm-lengths must lie in 32..{args.context - 16} (the context less the answer)")
    tables = []
    for spec in args.table or []:
        name, _, only = spec.partition(":")
        f, keep = Path(name), [g for g in only.split(",") if g]
        if not f.is_file():
            ap.error(f"--table: no file {f}")
        if any(g not in known for g in keep):
            ap.error(f"--table: {spec}: gates after ':' are among field, vllm, short")
        tables.append((f, set(keep)))
    args.table = tables
    return args


def host() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"cores": os.cpu_count(), "cpu": model, "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.table:
        rows = [r for f, keep in args.table for line in f.read_text().splitlines() if line.strip()
                for r in [json.loads(line)] if not keep or r.get("gate") in keep]
        if any("caught" not in r for r in rows):
            print("detection: --table takes judged results (results.jsonl), not measured.jsonl", file=sys.stderr)
            return 2
        md = table(rows, list(dict.fromkeys(r["gate"] for r in rows)))
        (args.out / "table.md").write_text(md)
        print(md)
        return 0
    (args.out / "command.txt").write_text("python benchmarks/detection.py " + " ".join(argv or sys.argv[1:]) + "\n")
    (args.out / "host.json").write_text(json.dumps(host(), indent=1) + "\n")
    slots: list = [set(args.cores[i * args.threads:(i + 1) * args.threads]) for i in range(args.jobs)]
    free, lock = (slots if args.jobs > 1 else [None]), threading.Lock()
    todo = []
    # the plain paths' group always runs (its repeats are the false-alarm runs); another set of
    # paths (the residue fault's) gets its own fault-free reference
    for group in dict.fromkeys([(), *(paths(f) for f in args.faults)]):
        todo += [(group, None, r) for r in range(args.repeats + 1 if group == () else 1)]
        todo += [(group, f, 0) for f in args.faults if paths(f) == group]

    measured = args.out / "measured.jsonl"         # each arm's rows as it finishes: nothing measured is lost
    measured.write_text("")

    def one(item):
        with lock:
            cpus = free.pop()
        try:
            got = arm(args, *item, cpus=cpus)
            with lock, measured.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in got)
            return got
        except Exception as e:                    # one line, the other arms go on
            print(f"detection: arm {item[1] or 'fault-free'} (repeat {item[2]}) failed: {e}", file=sys.stderr)
            return None
        finally:
            with lock:
                free.append(cpus)

    rows: list[dict] = []
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(len(free)) as pool:
        for got in pool.map(one, todo):
            rows += got or []
            failed += got is None
    if failed:
        print(f"detection: {failed} arm(s) failed; what they measured before is in {measured}", file=sys.stderr)
        return 1
    judge(rows, args.out)
    with (args.out / "results.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    md = table(rows, args.gates)
    (args.out / "table.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
