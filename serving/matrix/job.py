"""One configuration of a spread matrix, run where its job landed: `python -m niah.serving.matrix.job JOB.json`.

JOB.json (niah.runs.parts `write_job_spec`) names the matrix file, the
configuration, the sweep spec and the part folder. The job runs that one configuration
exactly as the local matrix does (serving/matrix/run.py: start its server, sweep, stop)
into its part folder only, resuming it when the part already holds a run, and records
itself in the part's job.status.json: host, CUDA_VISIBLE_DEVICES, the Slurm job id and
node list, start, end, exit status and, when it failed, the one-line error. SIGTERM (what
`scancel` and a time limit send first) stops the server like Ctrl-C; finished trials stay.
Exit status: 0 when the configuration ran (its server's own failures are recorded as error
trials, as locally), 2 on bad input, 1 on another error, 130 / 143 when interrupted.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from niah.errors import BadInput, NiahError
from niah.runs.manifest import MANIFEST
from niah.runs.parts import write_status
from niah.runs.record import now
from niah.serving.matrix.parse import Matrix, load_matrix
from niah.serving.matrix.run import sweep_matrix
from niah.sweep import SweepSpec
from niah.sweep.interrupt import EXIT_ON_SIGNAL, terminate_as_interrupt


def run_job(path: Path | str) -> int:
    """Run JOB.json's configuration into its part folder; returns the exit status."""
    job = json.loads(Path(path).read_text(encoding="utf-8"))
    part = Path(job["out"])
    if os.path.isdir(job["cwd"]):
        os.chdir(job["cwd"])  # relative paths in the matrix mean what they meant at submission
    write_status(part, {"host": socket.gethostname(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                        "slurm_nodes": os.environ.get("SLURM_JOB_NODELIST"),
                        "pid": os.getpid(), "started": now(), "ended": None, "exit": None, "error": None})
    code, error = 0, None
    try:
        with terminate_as_interrupt():
            matrix = load_matrix(job["matrix"])
            cfgs = [c for c in matrix.configs if c.name == job["config"]]
            if not cfgs:
                raise BadInput(f"{job['matrix']} has no configuration {job['config']!r} any more")
            spec = SweepSpec(**job["spec"])
            sweep_matrix(Matrix(matrix.path, cfgs), spec, part, resume=(part / MANIFEST).is_file(),
                         force_config=bool(job.get("force_config")))
    except KeyboardInterrupt as e:
        name = str(e.args[0]) if e.args else "SIGINT"
        code, error = EXIT_ON_SIGNAL.get(name, 130), f"interrupted ({name})"
    except NiahError as e:
        code, error = e.exit_code, str(e).splitlines()[0]
    except Exception as e:  # noqa: BLE001 (recorded, then the job fails with it)
        code, error = 1, f"{type(e).__name__}: {e}".splitlines()[0]
    write_status(part, {"ended": now(), "exit": code, "error": error})
    if error:
        print(f"niah: error: {error}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m niah.serving.matrix.job JOB.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(run_job(sys.argv[1]))
