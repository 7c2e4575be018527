"""`niah ...` run inside the test process: the console entry point itself (niah.cli:main,
what `[project.scripts] niah` runs), with sys.argv, the environment, the working folder
and stdin/stdout/stderr swapped for the call (click's CliRunner isolation).

For tests of what a command prints, writes and exits with, this is the same code path as a
subprocess without a fresh interpreter per call (about a second each on a busy 2-core
machine). It returns a subprocess.CompletedProcess, so a test reads it as it would a
subprocess: returncode, stdout, stderr. Like the real process, an exception that escapes
main() prints its traceback on stderr and exits 1 (tests that say "one line, no traceback"
still see one).

Where the process boundary is the behaviour (signals, the interpreter's own exit code,
servers niah leaves running, environment read at import), tests keep a real subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from typing import Mapping


def niah(*args, env: Mapping[str, str] | None = None, cwd=None, input: str | None = None,
         **_subprocess_kw) -> subprocess.CompletedProcess:
    """Run `niah ARGS` in this process. `env`, as for subprocess, is the whole environment
    (None: this one); `cwd` the working folder; other subprocess.run keywords (capture_output,
    text, timeout) are accepted and have no effect."""
    from click.testing import CliRunner

    from niah import client, redact
    from niah.cli import main

    # a fresh process starts with no remembered secrets and no pass-through headers or body:
    # so does each in-process call, whatever ran before it in this worker
    redact._remembered.clear()
    client._PASS.update(headers={}, body={})
    argv = ["niah", *map(str, args)]
    overrides = None
    if env is not None:
        overrides = {k: None for k in os.environ if k not in env}
        overrides.update({k: str(v) for k, v in env.items()})
    code = 0
    old_argv, old_cwd = sys.argv, os.getcwd()
    with CliRunner().isolation(input=input, env=overrides) as (out, err, _):
        sys.argv = argv
        try:
            if cwd is not None:
                os.chdir(cwd)
            main()
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:  # sys.exit("message"): the message on stderr, exit 1
                print(e.code, file=sys.stderr)
                code = 1
        except Exception:  # noqa: BLE001 - what the interpreter does with an uncaught exception
            traceback.print_exc()
            code = 1
        finally:
            sys.argv = old_argv
            os.chdir(old_cwd)
            sys.stdout.flush()
            sys.stderr.flush()
        stdout = out.getvalue().decode("utf-8", "replace")
        stderr = err.getvalue().decode("utf-8", "replace")
    return subprocess.CompletedProcess(argv, code, stdout, stderr)
