"""The SGLang server command line and environment for one configuration.

`build_sglang_command(SGLangLaunch(...)) -> (argv, env)`: argv starts with the launch
entry (`python -m niah.serving.sglang`), which installs the plugin and then runs
SGLang's own `sglang.launch_server` with the rest; env holds only the variables this
configuration sets (the caller merges it over os.environ).

One factor at a time: every arm gets the same flags and environment except the index
dtype and the kernels (and index_topk). Flags are those of SGLang 0.5.23 (verified in its
source: arg_groups/fields/*.py, environ.py):
- `--tp-size`, `--host`, `--port`, `--model-path`;
- `--json-model-override-args '{"index_topk": K}'` (the model config's index_topk) with
  `--dsa-topk-backend torch` and `SGLANG_DSA_FUSE_TOPK=false`: the unfused top-k, which
  the plugin runs in niah.kernels.topk_indices (any 0 < K <= 2048), in every arm;
- `SGLANG_DISABLE_DSA_INDEXER_FUSION=1` and `--disable-prefill-cuda-graph` in every arm:
  bf16 keys need both (the fused rope+quant+store kernel and the in-graph prefill split
  op write fp8 keys), so the fp8 arms get them too;
- kernels "niah" only: `SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1` and
  `SGLANG_OPT_USE_TILELANG_INDEXER=0`, so DeepSeek-V4's C4 indexer calls the paged-logits
  function the plugin replaces (V3.2 is routed through its resolvers either way). The
  stock arm forces nothing: SGLang picks DeepGEMM as it would without niah.
`refusals(...)` lists what the plugin cannot serve; the launch entry and the matrix
refuse those before anything starts.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field

from niah.errors import BadInput
from niah.serving.sglang.plugin import KERNELS, SGLANG_INDEX_DTYPES

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
    kernels: str | None = None  # None: "niah" for bf16, "stock" for fp8
    index_topk: int | None = None  # None: the model's own (V3.2: 2048)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable

    def validate(self) -> None:
        if not self.model_path:
            raise BadInput("sglang: model_path is required")
        if self.index_dtype not in SGLANG_INDEX_DTYPES:
            raise BadInput(f"sglang: index_dtype {self.index_dtype!r} is not one of {', '.join(SGLANG_INDEX_DTYPES)}")
        if self.kernels not in (None, *KERNELS):
            raise BadInput(f"sglang: kernels {self.kernels!r} is not one of {', '.join(KERNELS)}")
        if self.index_dtype == "bf16" and self.kernels == "stock":
            raise BadInput("sglang: bf16 index keys run on niah's kernels (kernels = \"niah\"), not stock")
        if not isinstance(self.tp, int) or self.tp < 1:
            raise BadInput(f"sglang: tp must be a positive integer, got {self.tp!r}")
        if not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise BadInput(f"sglang: port must be 1..65535, got {self.port!r}")
        if self.index_topk is not None and (not isinstance(self.index_topk, int)
                                            or not 0 < self.index_topk <= MAX_INDEX_TOPK):
            raise BadInput(f"sglang: index_topk must be 1..{MAX_INDEX_TOPK}, got {self.index_topk!r}")
        for flag in ("--json-model-override-args", "--niah-index-dtype", "--niah-kernels"):
            if any(a == flag or a.startswith(flag + "=") for a in self.extra_args):
                raise BadInput(f"sglang: extra_args may not set {flag}; use index_topk / index_dtype / kernels")
        problem = refusal(self.index_dtype, self.arm_kernels, self.extra_args)
        if problem:
            raise BadInput(f"sglang: {problem}")

    @property
    def arm_kernels(self) -> str:
        return self.kernels or ("niah" if self.index_dtype == "bf16" else "stock")


def _flag_value(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last of `names` in argv ("true" for a bare boolean flag)."""
    value = None
    for i, a in enumerate(argv):
        for n in names:
            if a == n:
                nxt = argv[i + 1] if i + 1 < len(argv) else ""
                value = nxt if nxt and not nxt.startswith("--") else "true"
            elif a.startswith(n + "="):
                value = a.split("=", 1)[1]
    return value


# (flags, refused when the value passes, why): checked for niah's kernels (bf16 included).
_REFUSED = (
    (("--enable-hierarchical-cache", "--enable-hicache"), lambda v: v != "false",
     "HiCache (its host pool and transfers are sized for 132-byte fp8 keys)"),
    (("--enable-hisparse",), lambda v: v != "false", "HiSparse (its own index-key paths)"),
    (("--dcp-size", "--decode-context-parallel-size"), lambda v: v not in ("1", "0"),
     "decode-context parallel (sharded key cache)"),
    (("--enable-dsa-cache-layer-split",), lambda v: v != "false", "layer-split DSA key cache pools"),
    (("--enable-kv-cache-sharding",), lambda v: v != "false", "page-interleave (sharded) key cache pools"),
    (("--enable-deepseek-v4-fp4-indexer",), lambda v: v != "false",
     "DeepSeek-V4 fp4 index keys (niah reads 132-byte fp8 or bf16 rows)"),
)


def refusal(index_dtype: str, kernels: str, argv: list[str]) -> str | None:
    """One line saying why niah's plugin cannot serve this arm with these SGLang
    arguments, or None. The stock arm is SGLang's own: nothing is refused there."""
    if kernels == "stock":
        return None
    for names, bad, what in _REFUSED:
        v = _flag_value(argv, names)
        if v is not None and bad(v.lower()):
            return f"{names[0]} is not supported with {index_dtype}/{kernels} index keys: {what}"
    override = _flag_value(argv, ("--json-model-override-args",))
    if override:
        try:
            kpool = json.loads(override).get("index_kpool", 1)
        except (ValueError, AttributeError):
            kpool = 1
        if kpool not in (None, 1):
            return f"index_kpool {kpool} is not supported with {index_dtype}/{kernels} (pooled key cache)"
    spec = _flag_value(argv, ("--speculative-algorithm",))
    if index_dtype == "bf16" and spec is not None and spec.lower() != "none":
        return (f"--speculative-algorithm {spec} (speculative decoding / MTP) is not supported with bf16 "
                "index keys: target-verify and draft-extend read the fp8 key layout")
    return None


def platform_refusal(kernels: str) -> str | None:
    """niah's kernels run on CUDA: ROCm (whose aiter/HIP indexer paths niah does not patch,
    and whose V4 indexer writes fp4/fp8 keys) is refused for them."""
    if kernels == "stock":
        return None
    import torch

    return f"ROCm is not supported with niah's kernels (kernels = {kernels!r})" if torch.version.hip else None


def build_sglang_command(cfg: SGLangLaunch) -> tuple[list[str], dict[str, str]]:
    """(argv, env) to start SGLang for `cfg` through niah's launch entry."""
    cfg.validate()
    kernels = cfg.arm_kernels
    argv = [cfg.python, "-m", LAUNCH_MODULE,
            "--niah-index-dtype", cfg.index_dtype,
            "--niah-kernels", kernels,
            "--model-path", cfg.model_path,
            "--tp-size", str(cfg.tp),
            "--host", cfg.host,
            "--port", str(cfg.port)]
    env = {"NIAH_INDEX_DTYPE": cfg.index_dtype, "NIAH_KERNELS": kernels,
           "SGLANG_DISABLE_DSA_INDEXER_FUSION": "1"}
    if kernels == "niah":
        env.update(SGLANG_FP8_PAGED_MQA_LOGITS_TORCH="1", SGLANG_OPT_USE_TILELANG_INDEXER="0")
    if cfg.index_topk is not None:
        # The unfused (niah) top-k for every K (2048 included): the matrix differs only in K.
        argv += ["--json-model-override-args", json.dumps({"index_topk": cfg.index_topk}),
                 "--dsa-topk-backend", "torch"]
        env["SGLANG_DSA_FUSE_TOPK"] = "false"
    argv += ["--disable-prefill-cuda-graph", *cfg.extra_args]
    env.update(cfg.env)
    return argv, env


def format_command(argv: list[str], env: dict[str, str]) -> str:
    """One shell line: `VAR=value ... argv` (quoted), for --dry-run output."""
    parts = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return " ".join(parts + [shlex.quote(a) for a in argv])
