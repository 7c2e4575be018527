"""Launch entry: `python -m niah.serving.sglang [--niah-index-dtype fp8|bf16]
[--niah-kernels stock|niah] <sglang args>`.

Refuses, with one line and exit 2 before anything loads, what the arm cannot serve,
decided on SGLang's own parse of the exact argv (refusals.py: HiCache, HiSparse, context
parallel, PD disaggregation, other paged-logits backends, layer-split and page-interleave
pools, index_kpool > 1, DeepSeek-V4 fp4 index keys, speculative decoding with bf16 keys,
the TileLang / AITER V4 indexers, SGLang's SM120 default for V4; an SGLANG_PLUGINS that
does not name niah; command.platform_refusal: ROCm with niah's kernels). Installs
niah's plugin (contract check first; refuses if the installed SGLang does not match),
exports NIAH_INDEX_DTYPE / NIAH_KERNELS so SGLang's spawned processes install it too
(through the `sglang.srt.plugins` entry point), then runs SGLang's own
`sglang.launch_server` with the remaining arguments. It adds no SGLang flag or variable.
niah's matrix starts only its niah arms (bf16/niah, fp8/niah) through this entry; the
fp8/stock arm is plain `python -m sglang.launch_server`.
"""

from __future__ import annotations

import os
import runpy
import sys

from niah.errors import BadInput, NiahError

NIAH_FLAG = "--niah-index-dtype"
KERNELS_FLAG = "--niah-kernels"


def split_niah_args(argv: list[str], env=None) -> tuple[str, str | None, list[str]]:
    """(index dtype, kernels or None, argv without niah's flags). Defaults from `env`
    (os.environ): $NIAH_INDEX_DTYPE or fp8; $NIAH_KERNELS or None (the dtype's default)."""
    env = os.environ if env is None else env
    found = {NIAH_FLAG: env.get("NIAH_INDEX_DTYPE") or "fp8",
             KERNELS_FLAG: env.get("NIAH_KERNELS") or None}
    rest: list[str] = []
    it = iter(range(len(argv)))
    for i in it:
        a = argv[i]
        flag = next((f for f in found if a == f or a.startswith(f + "=")), None)
        if flag is None:
            rest.append(a)
        elif a == flag:
            if i + 1 >= len(argv):
                raise BadInput(f"{flag} needs a value")
            found[flag] = argv[i + 1]
            next(it)
        else:
            found[flag] = a.split("=", 1)[1]
    return found[NIAH_FLAG], found[KERNELS_FLAG], rest


def main(argv: list[str] | None = None) -> None:
    from niah.serving.sglang import refusals
    from niah.serving.sglang.command import platform_refusal
    from niah.serving.sglang.plugin import SGLANG_INDEX_DTYPES, check_arm, default_kernels, entry_point_registered, install

    try:
        dtype, kernels, rest = split_niah_args(list(sys.argv[1:] if argv is None else argv))
        if dtype not in SGLANG_INDEX_DTYPES:
            raise BadInput(f"{NIAH_FLAG}: {dtype!r} is not one of {', '.join(SGLANG_INDEX_DTYPES)}")
        kernels = kernels or default_kernels(dtype)
        check_arm(dtype, kernels)
        args = refusals.check(dtype, kernels, rest, os.environ)  # SGLang's parser on the exact argv
        problem = platform_refusal(kernels) or (refusals.sm120_refusal(args, os.environ)
                                                if kernels != "stock" else None)
        if problem:
            raise BadInput(problem)
        if not entry_point_registered():
            raise BadInput("niah is not pip-installed in this Python environment, so SGLang's "
                           "model processes would start without its plugin; run "
                           "`pip install -e <niah checkout>` here first")
        os.environ["NIAH_INDEX_DTYPE"] = dtype
        os.environ["NIAH_KERNELS"] = kernels
        install(dtype, kernels)
    except NiahError as e:
        print(f"niah: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    sys.argv = ["sglang.launch_server", *rest]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
