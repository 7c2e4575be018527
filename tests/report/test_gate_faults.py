"""`niah gate` refuses a baseline whose server attests planted faults (`niah serve --fault`):
one line, exit 2; the same run as a candidate is gated as usual."""

from __future__ import annotations

import json
import os

from report_runs import make_run


def _niah(*args):
    from cli_inproc import niah  # the entry point in this process (tests/cli_inproc.py)

    return niah(*args, env=dict(os.environ))


def _attest(run, faults: list[str]) -> None:
    """Give the run's one configuration a start and end reading of a server attesting `faults`."""
    path = run / "manifest.json"
    man = json.loads(path.read_text())
    reading = {"error": None, "internal_states": None, "attested_states": 0,
               "attestation": {"index_dtype": None, "kernels": None, "facts": {"attention": "dense", "faults": faults},
                               "calls": {}}}
    man["configs"]["default"]["attestation"] = {"segments": [{"start": reading, "end": reading}]}
    path.write_text(json.dumps(man))


def test_gate_refuses_a_faulted_baseline_in_one_line(tmp_path):
    clean, faulty = make_run(tmp_path / "clean", trials=2), make_run(tmp_path / "faulty", trials=2)
    _attest(clean, [])
    _attest(faulty, ["residue:3"])
    r = _niah("gate", "--baseline", faulty, "--candidate", clean)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "'default' was served with planted faults (residue:3)" in err
    ok = _niah("gate", "--baseline", clean, "--candidate", faulty)   # a faulted candidate is what a gate is for
    assert ok.returncode == 0, ok.stdout + ok.stderr
