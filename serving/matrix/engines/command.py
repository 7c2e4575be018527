"""engine = "command": any OpenAI-compatible server (vLLM, llama.cpp, ...) from a configured argv.

Its keys: `command` (required: argv with `{port}` in it; `{axis}` keys such as
`{index_topk}` are filled from the configuration), readiness, the model name and labels.
`check` refuses an empty command, one without `{port}`, or a `{key}` the configuration does
not set; `generic_command` fills the placeholders in.
"""

from __future__ import annotations

import re

from niah.axes import AXIS_KEYS
from niah.kernels.rotation import ROTATIONS
from niah.serving.matrix.engines.base import Engine
from niah.serving.matrix.keys import choice, env_table, int_range, positive_number, string, string_list

KEYS = {
    "command": string_list,
    "env": env_table,
    "ready_timeout_s": positive_number,
    "health_paths": string_list,
    "model": string,
    "attention": string,
    "index_dtype": string,
    "index_rotation": choice(*ROTATIONS),
    "index_topk": int_range(1),
    "window": int_range(0),
    "tp": int_range(1),
}
PLACEHOLDER_RE = re.compile(r"\{([a-z_]+)\}")


def check_placeholders(settings: dict, where, fail) -> None:
    line = where("command")
    argv = settings["command"]
    if not argv:
        raise fail(line, "command must not be empty")
    if not any("{port}" in a for a in argv):
        raise fail(line, "command must contain {port} (niah chooses a free port)")
    for a in argv:
        for key in PLACEHOLDER_RE.findall(a):
            if key != "port" and key not in settings:
                raise fail(line, f"command uses {{{key}}} but this configuration sets no {key}")


def generic_command(cfg, port: int | str) -> tuple[list[str], dict[str, str]]:
    """The configured argv with {port} and {axis} keys filled in."""
    values = {**{k: str(v) for k, v in cfg.settings.items() if k in AXIS_KEYS}, "port": str(port)}
    argv = [PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), a) for a in cfg.settings["command"]]
    return argv, cfg.env


ENGINE = Engine("command", KEYS, required=("command",), command=generic_command, check=check_placeholders)
