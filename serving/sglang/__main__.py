"""Launch entry: `python -m niah.serving.sglang [--niah-index-dtype fp8|bf16]
[--niah-kernels stock|niah] <sglang args>`.

Refuses, with one line and exit 2 before anything loads, what the arm cannot serve,
decided on SGLang's own parse of the exact argv (refusals.py: HiCache, HiSparse, context
parallel, PD disaggregation, other paged-logits backends, layer-split and page-interleave
pools, index_kpool > 1, DeepSeek-V4 fp4 index keys, speculative decoding with bf16 keys,
the TileLang / AITER V4 indexers, SGLang's SM120 default for V4; an SGLANG_PLUGINS, or a
legacy SGL_PLUGINS that SGLang renames to it, that does not name niah; a later
--json-model-override-args that replaces niah's; ROCm with niah's kernels). Installs
niah's plugin (contract check first; refuses if the installed SGLang does not match),
exports NIAH_INDEX_DTYPE / NIAH_KERNELS so SGLang's spawned processes install it too
(through the `sglang.srt.plugins` entry point), then runs SGLang's own
`sglang.launch_server` with the remaining arguments. It adds no SGLang flag or variable.
niah's matrix starts only its niah arms (bf16/niah, fp8/niah) through this entry; the
fp8/stock and fp4/stock arms are plain `python -m sglang.launch_server` (fp4 keys are not the
plugin's: `--niah-index-dtype fp4` is refused here).
"""

from __future__ import annotations

import os
import runpy
import sys

from niah.errors import BadInput, NiahError
from niah.serving.sglang import refusals
from niah.serving.sglang.arms import (  # noqa: F401  (split_niah_args: re-exported)
    ENV_INDEX_DTYPE, ENV_KERNELS, KERNELS_FLAG, NIAH_FLAG, SGLANG_MODULE, check_arm, default_kernels,
    plugin_dtypes, split_niah_args)
from niah.serving.sglang.plugin import entry_point_registered, install


def main(argv: list[str] | None = None) -> None:
    try:
        dtype, kernels, rest = split_niah_args(list(sys.argv[1:] if argv is None else argv))
        if dtype not in plugin_dtypes():
            raise BadInput(f"{NIAH_FLAG}: {dtype!r} is not one of {', '.join(plugin_dtypes())}")
        kernels = kernels or default_kernels(dtype)
        check_arm(dtype, kernels)
        override = refusals.niah_override(rest)
        # SGLang's parser on the exact argv (also for stock here when niah wrote an override to keep)
        args = refusals.check(dtype, kernels, rest, os.environ, parsed=override is not None)
        problem = (refusals.entry_override_refusal(rest, args)
                   or refusals.platform_refusal(kernels)
                   or (refusals.sm120_refusal(args, os.environ) if kernels != "stock" else None))
        if problem:
            raise BadInput(problem)
        if not entry_point_registered():
            raise BadInput("niah is not pip-installed in this Python environment, so SGLang's "
                           "model processes would start without its plugin; run "
                           "`pip install 'niah-lab[sglang]'` (or `pip install -e <niah checkout>`) here first")
        os.environ[ENV_INDEX_DTYPE] = dtype
        os.environ[ENV_KERNELS] = kernels
        install(dtype, kernels)
    except NiahError as e:
        print(f"niah: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    sys.argv = [SGLANG_MODULE, *rest]
    runpy.run_module(SGLANG_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
