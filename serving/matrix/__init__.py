"""The configuration matrix: a TOML file naming the servers to compare, and its run.

    from niah.serving.matrix import load_matrix, run_matrix
    run_matrix("serving/examples/sglang.toml", spec, out)

serving/matrix/parse.py reads and checks the file (`load_matrix`, `parse_matrix`,
`matrix_topks`; serving/matrix/lines.py finds each key's line for error messages), each
engine's keys, command and checks being its own module's (serving/matrix/engines/, one
registry); serving/matrix/commands.py builds each configuration's command and the dry run,
serving/matrix/run.py runs the matrix here, one server at a time, through niah.sweep's one
orchestrator, and serving/matrix/spread.py runs it as jobs at once (the [executor] table:
serving/matrix/executor.py; each executor, e.g. Slurm or this host's GPU sets, its own
module: serving/matrix/executors/, one registry; what their jobs share: backends.py; one
part folder per configuration, merged into the run folder: parts.py; the job itself: job.py).
"""

from niah.serving.matrix.commands import (axis_differences, format_command, matrix_commands, print_matrix_commands,
                                          server_command)
from niah.serving.matrix.parse import Matrix, MatrixConfig, load_matrix, matrix_topks, parse_matrix
from niah.serving.matrix.run import sweep_matrix
from niah.serving.matrix.spread import run_matrix, spread_matrix

__all__ = ["Matrix", "MatrixConfig", "axis_differences", "format_command", "load_matrix", "matrix_commands",
           "matrix_topks", "parse_matrix", "print_matrix_commands", "run_matrix", "server_command", "spread_matrix",
           "sweep_matrix"]
