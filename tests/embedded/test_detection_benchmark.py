"""The detection benchmark (benchmarks/detection.py): its table, its options, and one real run.

- the table counts a fault caught only where the gate failed it, marks the vLLM-style gate's
  catch when that absolute gate fails the fault-free server too, and counts false alarms
  over the fault-free repeats (and the references of the absolute gate);
- `auto` scales vLLM's 4K-32K lengths to the served context; bad options are argparse's one
  line, exit 2;
- `--smoke` against real embedded servers (top-k 64, a 2,048-token context): the reference,
  a fault-free repeat and the topk fault each go through the three gates; the fault-free
  repeat passes the recommended gate against the reference (the CPU server is
  deterministic: no false alarm), and every row carries its cost.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import detection  # noqa: E402 - the benchmark beside its gates

pytestmark = pytest.mark.slow


def row(fault, gate, caught, repeat=0, group="", **kw):
    return {"fault": fault, "gate": gate, "caught": caught, "repeat": repeat, "group": group, "reference": False,
            "trials": 10, "seconds": 60.0, "cpu_s": 90.0, **kw}


def test_table_names_catches_misses_and_false_alarms():
    c4 = "--index-compress 4 --window 128"
    rows = [row(None, "field", False), row(None, "vllm", False),            # the plain paths' reference
            row(None, "field", False, group=c4), row(None, "vllm", True, group=c4),   # 4:1's: vLLM's fails it
            row(None, "field", True, 1), row(None, "vllm", False, 1),
            row("topk", "field", True), row("topk", "vllm", False),
            row("residue", "field", False, group=c4), row("residue", "vllm", True, group=c4)]
    md = detection.table(rows, ["field", "vllm"])
    lines = md.splitlines()
    assert lines[2] == "| `topk` | **yes** (10, 1.0, 1.5) | no (10, 1.0, 1.5) |"
    assert lines[3] == "| `residue` | no (10, 1.0, 1.5) | yes, but its fault-free server fails too (10, 1.0, 1.5) |"
    # field: the one repeat; vllm: the repeat and both references (an absolute gate's fault-free runs)
    assert md.rstrip().endswith("False alarms over fault-free servers: field: 1 of 1; vllm: 1 of 3")


def test_table_of_several_runs_takes_a_gate_from_the_file_named_for_it(tmp_path):
    """`--table NEW OLD:vllm`: a gate measured again (field, in NEW) is NEW's alone; OLD gives
    only its vLLM rows, so its field rows (a fault and a repeat) are neither cells nor alarms."""
    new = [row(None, "field", False), row(None, "field", False, 1), row("topk", "field", True)]
    old = [row(None, "field", False), row(None, "field", True, 1), row("topk", "field", False),
           row(None, "vllm", False), row("topk", "vllm", False)]
    for name, rows in (("new", new), ("old", old)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "table"
    assert detection.main(["--table", str(tmp_path / "new.jsonl"), f"{tmp_path / 'old.jsonl'}:vllm",
                           "--out", str(out)]) == 0
    md = (out / "table.md").read_text()
    assert "| `topk` | **yes** (10, 1.0, 1.5) | no (10, 1.0, 1.5) |" in md
    assert md.rstrip().endswith("False alarms over fault-free servers: field: 0 of 1; vllm: 0 of 1")
    with pytest.raises(SystemExit) as e:
        detection.parse(["--table", f"{tmp_path / 'old.jsonl'}:gsm8k"])
    assert e.value.code == 2


def test_vllm_lengths_scale_to_the_context_and_bad_options_are_one_line(capsys):
    assert detection.vllm_lengths("auto", 2048) == [256, 512, 1024, 2016]
    assert detection.vllm_lengths("300,600", 2048) == [300, 600]
    args = detection.parse(["--faults", "all", "--context", "4096"])
    assert "layout:2048" in args.faults and "residue" in args.faults and len(args.faults) == 7
    for bad, says in ((["--faults", "bogus"], "unknown fault(s) bogus"),
                      (["--gates", "field", "--repeat-gates", "short"], "--repeat-gates must be among --gates"),
                      (["--jobs", "999"], "this process may use"),
                      (["--context", "9000"], "--context must be 64..8192"),
                      (["--vllm-lengths", "2k"], "--vllm-lengths takes auto or a comma list"),
                      (["--vllm-lengths", "4000"], "--vllm-lengths must lie in 32..2032"),
                      (["--index-topk", "16"], "leaves the short check no prompt"),
                      (["--table", "no-such-results.jsonl"], "--table: no file")):
        with pytest.raises(SystemExit) as e:
            detection.parse(bad)
        assert e.value.code == 2 and says in capsys.readouterr().err


def test_smoke_run_judges_every_arm_against_its_reference(tmp_path):
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "detection.py"), "--smoke", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    arms = {(x["fault"], x["repeat"], x["gate"]) for x in rows}
    assert arms == {(f, rep, g) for f, rep in ((None, 0), (None, 1), ("topk", 0)) for g in ("field", "vllm", "short")}
    assert all(x["cpu_s"] > 0 and x["seconds"] > 0 and x["trials"] >= 1 for x in rows)
    assert all("--max-model-len 2048" in x["server"] for x in rows)
    assert all(not x.get("run") or x["run"].startswith("runs/") for x in rows)    # inside --out, relative
    assert len((tmp_path / "measured.jsonl").read_text().splitlines()) == len(rows)
    repeat = next(x for x in rows if x["fault"] is None and x["repeat"] == 1 and x["gate"] == "field")
    assert repeat["passed"] and repeat["verdict"].startswith("## niah gate: PASS")
    md = (tmp_path / "table.md").read_text()
    assert "| `topk` |" in md and "field: 0 of 1" in md
    assert (tmp_path / "command.txt").read_text().startswith("python benchmarks/detection.py --smoke")
    assert json.loads((tmp_path / "host.json").read_text())["cores"] >= 1
