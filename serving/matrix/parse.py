"""The configuration matrix: a small TOML file naming the servers to compare.

    engine = "embedded"            # default for every configuration below
    attention = "dsa"

    [axes]                         # every combination becomes one configuration
    index_dtype = ["fp8", "bf16"]
    index_topk = [512, 1024]       # -> fp8-k512, fp8-k1024, bf16-k512, bf16-k1024

    [[config]]                     # plus configurations listed one by one
    name = "dense"
    attention = "dense"

Top-level keys are defaults; `[axes]` lists values to cross; each `[[config]]` is one
more configuration (defaults + its own keys, no axes); `[executor]` says where they run
(serving/matrix/executor.py: local, local on disjoint GPU sets, or Slurm). The keys each engine accepts are
in `ENGINE_KEYS` (serving/matrix/keys.py); the axis names are niah.axes'. docs/matrix.md and serving/examples/*.toml
document them. Every error names the file and line (`BadInput`). `matrix_topks` reads
each configuration's index_topk. The run is serving/matrix/run.py; the command lines, the
dry run and the per-axis differences are serving/matrix/commands.py.
"""

from __future__ import annotations

import itertools
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from niah.axes import AXIS_KEYS, AXIS_NAMES
from niah.errors import BadInput
from niah.kernels import forms
from niah.serving.matrix.executor import Executor, parse_executor
from niah.serving.matrix.keys import (DEFAULT_READY_TIMEOUT_S, ENGINE_KEYS, ENGINES, HEALTH_PATHS, NAME_RE, REQUIRED,
                                      RESERVED_FLAGS)
from niah.serving.matrix.lines import TomlLines

@dataclass
class MatrixConfig:
    """One configuration to sweep: how to serve it and what it varies."""

    name: str
    engine: str  # embedded | sglang | external
    settings: dict[str, Any] = field(default_factory=dict)  # engine keys, defaults applied
    axes: dict[str, Any] = field(default_factory=dict)  # what tells it apart (manifest `axes`)
    line: int = 0  # where it was defined in the matrix file

    @property
    def launched(self) -> bool:
        return self.engine != "external"

    @property
    def env(self) -> dict[str, str]:
        """Environment overrides from the file (the engine builder may add more)."""
        return {k: _env_str(v) for k, v in self.settings.get("env", {}).items()}

    @property
    def ready_timeout_s(self) -> float:
        return float(self.settings.get("ready_timeout_s", DEFAULT_READY_TIMEOUT_S.get(self.engine, 300.0)))

    @property
    def health_paths(self) -> tuple[str, ...]:
        if "health_paths" in self.settings:
            return tuple(self.settings["health_paths"])
        return HEALTH_PATHS.get(self.engine, ("/health", "/v1/models"))


@dataclass
class Matrix:
    path: Path
    configs: list[MatrixConfig]
    executor: Executor = field(default_factory=Executor)  # the [executor] table (serving/matrix/executor.py)

    def names(self) -> list[str]:
        return [c.name for c in self.configs]


def _env_str(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


# -- parsing ------------------------------------------------------------------------------
def load_matrix(path: Path | str) -> Matrix:
    """Read and check a matrix file; expand its axes. BadInput names the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"no matrix file at {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read matrix file {path}: {e}") from None
    return parse_matrix(text, path)


def parse_matrix(text: str, path: Path | str = "<matrix>") -> Matrix:
    path = Path(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        line = m.group(1) if m else max(1, len(text.splitlines()))  # "at end of document"
        where = f"{path}:{line}"
        raise BadInput(f"{where}: TOML syntax error: {e}") from None
    lines = TomlLines(text)

    def fail(line: int, msg: str) -> BadInput:
        return BadInput(f"{path}:{line}: {msg}")

    defaults = {k: v for k, v in data.items() if k not in ("axes", "config", "executor")}
    executor = parse_executor(data.get("executor"), lambda key: f"{path}:{lines.of('executor', key)}")
    axes = data.get("axes", {})
    explicit = data.get("config", [])
    if not isinstance(axes, dict):
        raise fail(lines.of("", "axes"), "`axes` must be a table: [axes] index_topk = [512, 1024]")
    if not isinstance(explicit, list) or not all(isinstance(c, dict) for c in explicit):
        raise fail(lines.of("", "config"), "`config` must be written as [[config]] tables")
    if "name" in defaults:
        raise fail(lines.of("", "name"), "`name` belongs in a [[config]] table, not at the top level")

    configs = _crossed(axes, defaults, lines, fail) + _listed(explicit, defaults, lines, fail)
    configs.sort(key=lambda c: c.line)  # file order: a [[config]] above [axes] runs first
    if not configs:
        raise fail(1, "no configurations: add an [axes] table or a [[config]] table")
    seen: dict[str, MatrixConfig] = {}
    for c in configs:
        if c.name in seen:
            raise fail(c.line, f"configuration name {c.name!r} is used twice (also line {seen[c.name].line})")
        seen[c.name] = c
    return Matrix(path, configs, executor)


def _crossed(axes: dict, defaults: dict, lines: TomlLines, fail) -> list[MatrixConfig]:
    """The configurations of [axes]: checked against the default engine, crossed in file order."""
    configs: list[MatrixConfig] = []
    if not axes:
        return configs
    engine = defaults.get("engine")
    _check_engine(engine, lines.of("", "engine") if "engine" in defaults else lines.of("axes"), fail,
                  hint="set `engine = ...` at the top of the file for [axes] to expand")
    for key, values in axes.items():
        line = lines.of("axes", key)
        if key not in AXIS_NAMES:
            raise fail(line, f"unknown axis {key!r} (axes: {', '.join(AXIS_NAMES)})")
        if key not in ENGINE_KEYS[engine]:
            raise fail(line, f"axis {key!r} does not apply to engine {engine!r}")
        if not isinstance(values, list) or not values:
            raise fail(line, f"axis {key!r} must be a non-empty list, e.g. {key} = [...]")
        if len(set(map(repr, values))) != len(values):
            raise fail(line, f"axis {key!r} lists a value twice")
        for v in values:
            problem = ENGINE_KEYS[engine][key](v)
            if problem:
                raise fail(lines.of_value("axes", key, v), f"axis {key!r}: {problem}")
    base = _check_settings(defaults, "", lines, fail, partial=True)
    keys = list(axes)
    for combo in itertools.product(*(axes[k] for k in keys)):
        point = dict(zip(keys, combo))
        name = "-".join(AXIS_NAMES[k](v) for k, v in point.items())
        settings = {**base, **point}
        if _impossible(engine, settings):
            continue  # bf16 keys run on niah's kernels, fp4 keys on SGLang's: no bf16/stock or fp4/niah arm
        _check_required(settings, engine, lines.of("axes"), fail)
        if engine == "command":
            _check_placeholders(settings, lines.of("", "command"), fail)
        configs.append(MatrixConfig(name, engine, settings, point, lines.of("axes")))
    return configs


def _listed(explicit: list, defaults: dict, lines: TomlLines, fail) -> list[MatrixConfig]:
    """The [[config]] tables: defaults + each one's own keys (no axes)."""
    configs: list[MatrixConfig] = []
    for i, entry in enumerate(explicit):
        section = ("config", i)
        line = lines.of(section)
        if "name" not in entry:
            raise fail(line, "[[config]] needs a `name`")
        name = entry["name"]
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise fail(lines.of(section, "name"),
                       f"config name {name!r}: use letters, digits, '.', '_' or '-' (it names a log file)")
        merged = {**defaults, **{k: v for k, v in entry.items() if k != "name"}}
        if "engine" in entry and "engine" in defaults and entry["engine"] != defaults["engine"]:
            # A different engine: top-level keys of the default engine do not carry over.
            merged = {k: v for k, v in merged.items() if k in entry or k in ENGINE_KEYS.get(entry["engine"], {})}
        settings = _check_settings(merged, section, lines, fail, partial=False, own=set(entry))
        engine = settings.pop("engine")
        if _impossible(engine, settings):
            raise fail(lines.of(section, "kernels"), _impossible(engine, settings))
        axes_of = {k: entry[k] for k in AXIS_KEYS if k in entry}
        configs.append(MatrixConfig(name, engine, settings, axes_of, line))
    return configs


def _impossible(engine: str, settings: dict[str, Any]) -> str | None:
    """Why an SGLang arm cannot exist (bf16 keys on stock kernels, fp4 keys on niah's), or None."""
    if engine != "sglang":
        return None
    dtype, kernels = settings.get("index_dtype"), settings.get("kernels")
    form = forms.get(dtype) if isinstance(dtype, str) else None
    if form is None or kernels is None or kernels in form.sglang_kernels:
        return None
    if kernels == forms.STOCK:
        return f"sglang: {dtype} index keys run on kernels = \"niah\", not stock"
    return f"sglang: {dtype} index keys run on SGLang's own kernels (kernels = \"stock\"), not niah's"


def _check_engine(engine: Any, line: int, fail, hint: str = "") -> None:
    if engine is None:
        raise fail(line, f"no engine given ({hint or 'set engine = ...'}); engines: {', '.join(ENGINES)}")
    if engine not in ENGINES:
        raise fail(line, f"unknown engine {engine!r} (engines: {', '.join(ENGINES)})")


def _check_settings(values: dict[str, Any], section: Any, lines: TomlLines, fail, partial: bool,
                    own: set[str] | None = None) -> dict[str, Any]:
    """Check keys and values against the engine. `partial`: the top-level defaults used by
    [axes] (required keys are checked per configuration instead)."""

    def where(key: str) -> int:
        if own is not None and key not in own:
            return lines.of("", key)  # inherited from the top level
        return lines.of(section, key)

    engine = values.get("engine")
    _check_engine(engine, where("engine") if "engine" in values else lines.of(section), fail)
    allowed = ENGINE_KEYS[engine]
    out: dict[str, Any] = {}
    for key, v in values.items():
        if key == "engine":
            continue
        if key not in allowed:
            hint = ""
            for other, keys in ENGINE_KEYS.items():
                if other != engine and key in keys:
                    hint = f" (it is a key of engine {other!r})"
                    break
            raise fail(where(key), f"unknown key {key!r} for engine {engine!r}{hint}; "
                                   f"keys: {', '.join(sorted(allowed))}")
        problem = allowed[key](v)
        if problem:
            raise fail(where(key), f"{key} {problem}")
        if key == "args":
            for a in v:
                flag = a.split("=", 1)[0]
                if flag in RESERVED_FLAGS:
                    raise fail(where(key), f"args may not set {flag} ({RESERVED_FLAGS[flag]})")
        out[key] = v
    if not partial:
        _check_required({**out}, engine, lines.of(section), fail)
        if engine == "command":
            _check_placeholders(out, where("command"), fail)
        out["engine"] = engine
    return out


PLACEHOLDER_RE = re.compile(r"\{([a-z_]+)\}")


def _check_placeholders(settings: dict[str, Any], line: int, fail) -> None:
    argv = settings["command"]
    if not argv:
        raise fail(line, "command must not be empty")
    if not any("{port}" in a for a in argv):
        raise fail(line, "command must contain {port} (niah chooses a free port)")
    for a in argv:
        for key in PLACEHOLDER_RE.findall(a):
            if key != "port" and key not in settings:
                raise fail(line, f"command uses {{{key}}} but this configuration sets no {key}")


def _check_required(settings: dict[str, Any], engine: str, line: int, fail) -> None:
    for key in REQUIRED[engine]:
        if key not in settings:
            raise fail(line, f"engine {engine!r} needs `{key}` (missing {key})")


def matrix_topks(path, context_too: bool = False) -> tuple[dict[str, int | None], int | None]:
    """{config: index_topk (None: dense)} of a matrix file (read by its own loader), and,
    with context_too, the model's context where the matrix says it (the embedded engine:
    its model's block size, times the YaRN factor when its args ask for `--rope-scaling yarn`,
    the smallest over the configurations; that imports torch, so only `--lengths auto` asks)."""
    topks: dict[str, int | None] = {}
    context = None
    for c in load_matrix(path).configs:
        dense = str(c.settings.get("attention", c.axes.get("attention", "dsa"))) == "dense"
        topks[c.name] = None if dense else c.settings.get("index_topk", c.axes.get("index_topk"))
        if context_too and c.engine == "embedded":
            n = _embedded_context([str(a) for a in c.settings.get("args") or []])
            context = n if context is None else min(context, n)
    return topks, context


def _embedded_context(args: list[str]) -> int:
    """The embedded model's context under its command-line args (`niah serve`'s defaults)."""
    from niah.serving.embedded.model import ModelArgs  # noqa: PLC0415 (imports torch)

    def value(flag: str, default: str) -> str:
        return args[args.index(flag) + 1] if flag in args[:-1] else default

    scaling = value("--rope-scaling", "none")
    if scaling != "yarn":
        return ModelArgs.block_size
    return ModelArgs.from_meta({"config": {"block_size": ModelArgs.block_size}}, "yarn",
                               float(value("--rope-factor", "4.0"))).block_size
