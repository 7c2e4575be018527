"""`niah report` (and compare, gate) import nothing of niah.sweep: a report reads run folders
(niah.runs) and never runs anything."""

from __future__ import annotations

import subprocess
import sys


def test_report_imports_nothing_of_the_sweep():
    code = ("import sys, niah.report, niah.report.render, niah.report.gate, niah.report.compare, "
            "niah.commands.report, niah.commands.gate\n"
            "print(sorted(m for m in sys.modules if m == 'niah.sweep' or m.startswith('niah.sweep.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
