"""The SGLang server command line and environment for one configuration.

`build_sglang_command(SGLangLaunch(...)) -> (argv, env)`: argv starts with the launch
entry (`python -m niah.serving.sglang`), which installs the plugin and then runs
SGLang's own `sglang.launch_server` with the rest; env holds only the variables this
configuration sets (the caller merges it over os.environ).

Flags are those of SGLang 0.5.23 (verified in its source: arg_groups/fields/*.py,
environ.py):
- `--tp-size` (0.5.23 has no `--tp` alias), `--host`, `--port`, `--model-path`;
- `--json-model-override-args '{"index_topk": K}'` (the model config's index_topk);
- `--dsa-topk-backend torch` with `SGLANG_DSA_FUSE_TOPK=false` whenever index_topk is
  given: the top-k backend that accepts any 0 < K <= 2048 (used for every K, so the
  configurations of a matrix differ only in K);
- `SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1` and `SGLANG_OPT_USE_TILELANG_INDEXER=0` so
  DeepSeek-V4's C4 indexer calls the paged-logits function the plugin replaces (TileLang
  comes first in its if-chain and SGLang turns it on by default on SM120); V3.2 is
  routed through its resolvers either way;
- bf16 index keys also set `SGLANG_DISABLE_DSA_INDEXER_FUSION=1` (the fused
  rope+quant+store kernel writes fp8) and `--disable-prefill-cuda-graph` (the in-graph
  prefill split op writes fp8 keys through SGLang's fused path).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field

from niah.errors import BadInput
from niah.serving.sglang.plugin import SGLANG_INDEX_DTYPES

LAUNCH_MODULE = "niah.serving.sglang"
MAX_INDEX_TOPK = 2048  # SGLang's v2 top-k: 0 < k <= 2048


@dataclass
class SGLangLaunch:
    """How to serve one configuration with SGLang (and niah's plugin)."""

    model_path: str
    tp: int = 1
    port: int = 30000
    host: str = "127.0.0.1"
    index_dtype: str = "fp8"
    index_topk: int | None = None  # None: the model's own (V3.2: 2048)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable

    def validate(self) -> None:
        if not self.model_path:
            raise BadInput("sglang: model_path is required")
        if self.index_dtype not in SGLANG_INDEX_DTYPES:
            raise BadInput(f"sglang: index_dtype {self.index_dtype!r} is not one of {', '.join(SGLANG_INDEX_DTYPES)}")
        if not isinstance(self.tp, int) or self.tp < 1:
            raise BadInput(f"sglang: tp must be a positive integer, got {self.tp!r}")
        if not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise BadInput(f"sglang: port must be 1..65535, got {self.port!r}")
        if self.index_topk is not None and (not isinstance(self.index_topk, int)
                                            or not 0 < self.index_topk <= MAX_INDEX_TOPK):
            raise BadInput(f"sglang: index_topk must be 1..{MAX_INDEX_TOPK}, got {self.index_topk!r}")
        for flag in ("--json-model-override-args", "--niah-index-dtype"):
            if any(a == flag or a.startswith(flag + "=") for a in self.extra_args):
                raise BadInput(f"sglang: extra_args may not set {flag}; use index_topk / index_dtype")


def build_sglang_command(cfg: SGLangLaunch) -> tuple[list[str], dict[str, str]]:
    """(argv, env) to start SGLang for `cfg` through niah's launch entry."""
    cfg.validate()
    argv = [cfg.python, "-m", LAUNCH_MODULE,
            "--niah-index-dtype", cfg.index_dtype,
            "--model-path", cfg.model_path,
            "--tp-size", str(cfg.tp),
            "--host", cfg.host,
            "--port", str(cfg.port)]
    env = {"NIAH_INDEX_DTYPE": cfg.index_dtype,
           "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1",
           "SGLANG_OPT_USE_TILELANG_INDEXER": "0"}
    if cfg.index_topk is not None:
        # The torch top-k for every K (2048 included): the matrix then differs only in K.
        argv += ["--json-model-override-args", json.dumps({"index_topk": cfg.index_topk}),
                 "--dsa-topk-backend", "torch"]
        env["SGLANG_DSA_FUSE_TOPK"] = "false"
    if cfg.index_dtype == "bf16":
        argv += ["--disable-prefill-cuda-graph"]
        env["SGLANG_DISABLE_DSA_INDEXER_FUSION"] = "1"
    argv += list(cfg.extra_args)
    env.update(cfg.env)
    return argv, env


def format_command(argv: list[str], env: dict[str, str]) -> str:
    """One shell line: `VAR=value ... argv` (quoted), for --dry-run output."""
    parts = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return " ".join(parts + [shlex.quote(a) for a in argv])
