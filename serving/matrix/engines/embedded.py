"""engine = "embedded": niah's own CPU/GPU server (`niah serve`), launched per configuration.

Its keys (attention, index keys, top-k, window, the serving paths: page_size,
prefill_chunk, prefix_cache, index_compress; the interpreter), its command (`python -m
niah serve` with one flag per key set, on 127.0.0.1 and the chosen port, then `args`), its
readiness defaults, and its model's context for `--lengths auto` (`context`).
"""

from __future__ import annotations

import sys

from niah.kernels.rotation import ROTATIONS
from niah.serving.embedded import precision
from niah.serving.launch import HOST
from niah.serving.matrix.engines.base import Engine
from niah.serving.matrix.keys import COMMON, choice, choice_of, int_range, string

KEYS = {
    **COMMON,
    "attention": choice("dense", "dsa"),
    "index_dtype": choice_of(precision.index_dtypes),  # the forms table (niah.kernels.forms), read when checked
    "index_query_dtype": choice_of(precision.query_dtypes),
    "rescore_factor": int_range(1),
    "index_rotation": choice(*ROTATIONS),
    "index_topk": int_range(1),
    "window": int_range(0),
    "page_size": int_range(1),
    "prefill_chunk": int_range(1),
    "prefix_cache": choice(True, False),
    "index_compress": int_range(1, 4),
    "python": string,
}
FLAGS = (("attention", "--attention"), ("index_dtype", "--index-dtype"), ("index_rotation", "--index-rotation"),
         ("index_query_dtype", "--index-query-dtype"), ("rescore_factor", "--rescore-factor"),
         ("index_topk", "--index-topk"), ("window", "--window"), ("page_size", "--page-size"),
         ("prefill_chunk", "--prefill-chunk"), ("index_compress", "--index-compress"))


def embedded_command(cfg, port: int | str) -> tuple[list[str], dict[str, str]]:
    """argv and environment overrides for the embedded server (`niah serve`)."""
    s = cfg.settings
    argv = [s.get("python", sys.executable), "-m", "niah", "serve"]
    for key, flag in FLAGS:
        if key in s:
            argv += [flag, str(s[key])]
    if s.get("prefix_cache"):
        argv.append("--prefix-cache")
    argv += ["--host", HOST, "--port", str(port), *s.get("args", [])]
    return argv, cfg.env


def embedded_context(cfg) -> int:
    """The embedded model's context under the configuration's args (`niah serve`'s defaults):
    its block size, times the YaRN factor when the args ask for `--rope-scaling yarn`."""
    from niah.serving.embedded.model import ModelArgs  # noqa: PLC0415 (imports torch)

    args = [str(a) for a in cfg.settings.get("args") or []]

    def value(flag: str, default: str) -> str:
        return args[args.index(flag) + 1] if flag in args[:-1] else default

    if value("--rope-scaling", "none") != "yarn":
        return ModelArgs.block_size
    return ModelArgs.from_meta({"config": {"block_size": ModelArgs.block_size}}, "yarn",
                               float(value("--rope-factor", "4.0"))).block_size


ENGINE = Engine("embedded", KEYS, command=embedded_command, health_paths=("/health", "/v1/models"),
                ready_timeout_s=300.0, context=embedded_context)
