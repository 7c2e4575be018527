"""What launches each configuration of a matrix: exact command lines and environments.

`server_command(cfg, port)` is the argv and environment that serve one configuration
(embedded: `niah serve`; sglang: serving/sglang builds it; command: the configured argv
with {port} and axis keys filled in). `matrix_commands` / `print_matrix_commands` are the
dry run; `axis_differences` says what tells configurations apart on the command line.
"""

from __future__ import annotations

import difflib
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from niah.axes import AXIS_KEYS, comparable_axes
from niah.errors import BadInput
from niah.kernels import forms
from niah.redact import redact_argv, redact_env
from niah.serving.launch import HOST
from niah.serving.matrix.backends import print_jobs
from niah.serving.matrix.keys import PORT_PLACEHOLDER
from niah.serving.matrix.parse import PLACEHOLDER_RE, Matrix, MatrixConfig, load_matrix
from niah.serving.sglang import refusals
from niah.serving.sglang.arms import default_kernels
from niah.serving.sglang.command import ARMS, SGLangLaunch, arm_name, build_sglang_command
from niah.serving.sglang.refusals import parser_status


# -- commands -----------------------------------------------------------------------------
def embedded_command(cfg: MatrixConfig, port: int | str) -> tuple[list[str], dict[str, str]]:
    """argv and environment overrides for the embedded CPU server (`niah serve`)."""
    s = cfg.settings
    argv = [s.get("python", sys.executable), "-m", "niah", "serve"]
    for key, flag in (("attention", "--attention"), ("index_dtype", "--index-dtype"),
                      ("index_rotation", "--index-rotation"), ("index_query_dtype", "--index-query-dtype"),
                      ("rescore_factor", "--rescore-factor"), ("index_topk", "--index-topk"), ("window", "--window")):
        if key in s:
            argv += [flag, str(s[key])]
    argv += ["--host", HOST, "--port", str(port), *s.get("args", [])]
    return argv, cfg.env


def sglang_command(cfg: MatrixConfig, port: int | str) -> tuple[list[str], dict[str, str]]:
    """argv and environment for one SGLang arm (serving/sglang builds them: stock is SGLang's
    own launch_server, niah arms go through niah's launch entry). What the arm cannot serve
    is refused here when SGLang's parser is importable, else by the launch entry
    (serving/sglang/refusals.py)."""
    s = cfg.settings
    launch = SGLangLaunch(
        model_path=s["model_path"], tp=s.get("tp", 1), port=_PORT_SENTINEL if port == PORT_PLACEHOLDER else port,
        host=HOST, index_dtype=s.get("index_dtype", forms.DEFAULT), kernels=s.get("kernels"),
        index_topk=s.get("index_topk"),
        extra_args=list(s.get("args", [])), env=cfg.env,
    )
    if "python" in s:
        launch.python = s["python"]
    try:
        argv, env = build_sglang_command(launch)
        merged = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
        override = {} if launch.index_topk is None else {"index_topk": launch.index_topk}
        refusals.check_command(argv, merged, override, launch.index_dtype)  # where SGLang's parser is importable
    except BadInput as e:
        raise BadInput(f"{cfg.name} (line {cfg.line}): {e}") from None
    return _with_placeholder(argv, port), env


_PORT_SENTINEL = 65535


def _with_placeholder(argv: list[str], port: int | str) -> list[str]:
    if port != PORT_PLACEHOLDER:
        return argv
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a == "--port" and out[i + 1] == str(_PORT_SENTINEL):
            out[i + 1] = PORT_PLACEHOLDER
    return out


def generic_command(cfg: MatrixConfig, port: int | str) -> tuple[list[str], dict[str, str]]:
    """engine = "command": the configured argv with {port} and {axis} keys filled in."""
    values = {**{k: str(v) for k, v in cfg.settings.items() if k in AXIS_KEYS}, "port": str(port)}
    argv = [PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), a) for a in cfg.settings["command"]]
    return argv, cfg.env


def server_command(cfg: MatrixConfig, port: int | str) -> tuple[list[str], dict[str, str]]:
    """The exact command and environment overrides that serve `cfg` on `port`."""
    if cfg.engine == "command":
        return generic_command(cfg, port)
    if cfg.engine == "embedded":
        return embedded_command(cfg, port)
    if cfg.engine == "sglang":
        return sglang_command(cfg, port)
    raise ValueError(f"engine {cfg.engine!r} is not launched by niah")


def format_command(argv: list[str], env: dict[str, str | None]) -> str:
    """A shell line: `[env -u NAME ...] NAME=value ... argv`, the port placeholder left
    unquoted (a None value removes an inherited variable); secrets masked (niah.redact):
    the line is printed and recorded in the manifest."""
    argv, env = redact_argv(argv, env), redact_env(env)
    unset = [f"-u {k}" for k, v in env.items() if v is None]
    parts = (["env", *unset] if unset else []) + [f"{k}={shlex.quote(v)}" for k, v in env.items() if v is not None]
    parts += [a if a == PORT_PLACEHOLDER else shlex.quote(a) for a in argv]
    return " ".join(parts)


def arm_of(cfg: MatrixConfig) -> dict[str, str] | None:
    """What an SGLang configuration's arm runs, in words (command.ARMS); None for other engines."""
    if cfg.engine != "sglang":
        return None

    dtype = cfg.settings.get("index_dtype", forms.DEFAULT)
    kernels = cfg.settings.get("kernels") or default_kernels(dtype)
    return {"arm": arm_name(dtype, kernels), **ARMS[arm_name(dtype, kernels)]}


def matrix_commands(matrix_path: Path | str | Matrix) -> list[tuple[MatrixConfig, str]]:
    """(configuration, what would run) for every configuration, without starting anything."""
    matrix = matrix_path if isinstance(matrix_path, Matrix) else load_matrix(matrix_path)
    out = []
    for cfg in matrix.configs:
        if cfg.launched:
            argv, env = server_command(cfg, PORT_PLACEHOLDER)
            out.append((cfg, format_command(argv, env)))
        else:
            model = cfg.settings.get("model")
            out.append((cfg, f"(external) {cfg.settings['endpoint']}" + (f" model={model}" if model else "")))
    return out


REMOVED = "(removed)"  # an inherited variable the configuration removes (env value None)


def _launcher(argv: list[str]) -> str | None:
    """The module of `python -m MODULE ...`, else None."""
    return argv[2] if len(argv) > 2 and argv[1] == "-m" else None


def _flag_groups(tokens: list[str]) -> list[str]:
    """["--a", "1", "--b", "x", "y"] -> ["--a 1", "--b x y"] (one piece per flag)."""
    groups: list[list[str]] = []
    for t in tokens:
        if t.startswith("--") or not groups:
            groups.append([t])
        else:
            groups[-1].append(t)
    return [" ".join(g) for g in groups]


def _argv_diff(a: list[str], b: list[str]) -> list[str]:
    """What differs between two argument lists, one piece per flag: "--f x -> --f y" for a
    changed value, "+ --f y" / "- --f x" for a flag only one side has."""
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        old, new = a[i1:i2], b[j1:j2]
        values_only = old and new and not any(t.startswith("--") for t in old + new)
        if values_only and i1 and a[i1 - 1].startswith("--"):
            flag = a[i1 - 1]
            out.append(f"{flag} {' '.join(old)} -> {flag} {' '.join(new)}")
        elif values_only:
            out.append(f"{' '.join(old)} -> {' '.join(new)}")
        else:
            out += [f"- {g}" for g in _flag_groups(old)] + [f"+ {g}" for g in _flag_groups(new)]
    return out


def command_difference(a: tuple[list[str], dict], b: tuple[list[str], dict]) -> dict[str, Any]:
    """What differs between two (argv, env) commands: the launcher module (`python -m X`),
    the argument pieces, the environment variables, and how many things that is."""
    (argv_a, env_a), (argv_b, env_b) = a, b
    la, lb = _launcher(argv_a), _launcher(argv_b)
    launcher = [la, lb] if la != lb else None
    head = 3 if la and lb else 0
    argv = _argv_diff(argv_a[head:], argv_b[head:]) if launcher or argv_a[:head] == argv_b[:head] \
        else _argv_diff(argv_a, argv_b)

    def shown(env, k):
        return REMOVED if k in env and env[k] is None else env.get(k)

    env = {k: [shown(env_a, k), shown(env_b, k)] for k in sorted(set(env_a) | set(env_b))
           if shown(env_a, k) != shown(env_b, k)}
    return {"count": (1 if launcher else 0) + len(argv) + len(env), "launcher": launcher, "argv": argv, "env": env}


def axis_differences(matrix: Matrix) -> list[dict[str, Any]]:
    """For each axis, every pair of configurations whose axes differ in that axis only,
    with what differs between their commands (command_difference: "count", "launcher",
    "argv" pieces, "env": {NAME: [a, b]}). One factor at a time: nothing else may differ."""
    launched = [c for c in matrix.configs if c.launched and c.axes]
    built = {c.name: server_command(c, PORT_PLACEHOLDER) for c in launched}
    out = []
    for i, a in enumerate(launched):
        for b in launched[i + 1:]:
            axes_a, axes_b = comparable_axes(a.axes, b.axes, a.settings, b.settings)
            if set(axes_a) != set(axes_b):
                continue
            diff = [k for k in axes_a if axes_a[k] != axes_b[k]]
            if len(diff) != 1:
                continue
            out.append({"axis": diff[0], "a": a.name, "b": b.name, **command_difference(built[a.name], built[b.name])})
    return out


def describe_difference(d: dict[str, Any]) -> str:
    """One line: `N difference(s): launcher -m X -> -m Y; piece; NAME=a -> NAME=b`."""
    parts = [f"launcher -m {d['launcher'][0]} -> -m {d['launcher'][1]}"] if d.get("launcher") else []
    parts += d["argv"]
    parts += [f"{k}={v[0] if v[0] is not None else '(not set)'} -> {k}={v[1] if v[1] is not None else '(not set)'}"
              for k, v in d["env"].items()]
    n = d["count"]
    return f"{n} difference{'s' if n != 1 else ''}: {'; '.join(parts)}" if parts else "nothing"


def print_matrix_commands(matrix_path: Path | str, file=None, executor=None, out: Path | str | None = None) -> None:
    """The dry run: each configuration's exact command line and environment, then what
    differs between the arms of each axis; with a spread `executor` (default: the file's),
    the jobs it would run into `out` (serving/matrix/backends.py `print_jobs`)."""
    file = file or sys.stdout
    matrix = load_matrix(matrix_path)
    executor = executor or matrix.executor
    rows = matrix_commands(matrix)
    print(f"# {len(rows)} configuration(s) from {matrix_path}; "
          f"{PORT_PLACEHOLDER} is a free loopback port chosen at launch", file=file)
    for cfg, line in rows:
        axes = " ".join(f"{k}={v}" for k, v in cfg.axes.items())
        print(f"\n# {cfg.name}  [{cfg.engine}]" + (f"  {axes}" if axes else ""), file=file)
        arm = arm_of(cfg)
        if arm:
            print(f"# arm {arm['arm']}: keys {arm['index_keys']}; query {arm['query']}; logits {arm['logits']}; "
                  f"top-k {arm['top_k']}; paths {arm['paths']}", file=file)
        print(line, file=file)
    if any(cfg.engine == "sglang" for cfg, _ in rows):
        why = parser_status()
        print("\n# SGLang arguments: " + ("checked with SGLang's own parser here (refusals: serving/sglang/refusals.py)"
              if why is None else f"not checked here ({why}); the launch entry checks them with "
                                  "SGLang's parser before weights load"), file=file)
    diffs = axis_differences(matrix)
    if diffs:
        print("\n# Differences between the arms of each axis (nothing else differs):", file=file)
    for d in diffs:
        print(f"# {d['axis']}: {d['a']} -> {d['b']}: {describe_difference(d)}", file=file)
    if executor.spread:
        print_jobs(matrix, executor, Path(out) if out is not None else Path("results") / "<timestamp>", file)
