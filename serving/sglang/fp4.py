"""SGLang's own fp4 arm (fp4/stock): plain `python -m sglang.launch_server` with
`--enable-deepseek-v4-fp4-indexer` (DeepSeek-V4's MXFP4 index keys, 68 bytes a token), the
fp8/stock command with that one flag added (command.py builds it).

SGLang 0.5.23 accepts the flag on SM100, SM120 and gfx95 only and refuses it elsewhere, e.g.
on an H200 (SM90), when it resolves its arguments (arg_groups/serving_hook.py,
handle_environment_variables, its ValueError: `FP4_REASON`). niah refuses first, with SGLang's
reason, before any server of a matrix starts (`fp4_platform_refusal`; serving/matrix/run.py
asks it of every fp4 arm): SGLang's own parser reads the exact argv and SGLang's own
platform probe (`get_platform()`, `is_gfx95_supported()`) decides, both run by the server's
Python in a subprocess (`fp4_platform_probe`): the server's SGLang, not niah's environment,
is the one that would refuse, and no CUDA context is made in niah's process. Where that
Python cannot parse the arguments with SGLang, niah refuses too (fail closed: the server
could not start either).

`stock_fp4_refusal(index_dtype, args)`: a stock arm's parsed fp4 field must be its label (on
in fp4, off in fp8): a --config file that turns it on in the fp8 arm is refused
(refusals.check_command runs it on SGLang's parse). The plugin's arms refuse fp4 pools
(refusals.RULES; v4.py when the pool is built).
"""

from __future__ import annotations

import json
from typing import Mapping

from niah.errors import BadInput
from niah.serving.sglang.arms import FP4_FIELD, FP4_FLAG

# SGLang 0.5.23's refusal of the fp4 indexer, word for word (arg_groups/serving_hook.py,
# handle_environment_variables; tests/sglang/test_sglang_fp4.py reads it there).
FP4_REASON = "--enable-deepseek-v4-fp4-indexer requires SM100, SM120, or gfx95 GPUs with FP4 indexer support."

# Run by the server's Python: SGLang's parse of the exact argv, then SGLang's own condition.
_FP4_PROBE = """
import json, sys
from sglang.srt.server_args import prepare_server_args
args = prepare_server_args(json.loads(sys.argv[1]))
on = bool(getattr(args, "enable_deepseek_v4_fp4_indexer"))
supported = None
if on:
    from sglang.srt.runtime_context import get_platform
    from sglang.srt.utils.common import is_gfx95_supported
    p = get_platform()
    supported = bool(p.is_sm100 or p.is_sm120 or is_gfx95_supported())
print("NIAH_FP4_PROBE " + json.dumps({"on": on, "supported": supported}))
"""


def fp4_platform_probe(python: str, sglang_argv: list[str], env: Mapping[str, str]) -> dict:
    """{"on": the parsed fp4 field, "supported": SGLang's platform condition (None when off)},
    decided by `python` (the server's) with its SGLang; BadInput (one line) when it cannot tell."""
    import subprocess  # noqa: PLC0415 (only where an fp4 arm is about to launch)

    try:
        r = subprocess.run([python, "-c", _FP4_PROBE, json.dumps(list(sglang_argv))], capture_output=True, text=True,
                           env=dict(env), timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BadInput(f"cannot ask {python} whether SGLang accepts {FP4_FLAG} here: {type(e).__name__}: {e}") from None
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("NIAH_FP4_PROBE ")), None)
    if r.returncode != 0 or line is None:
        last = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        raise BadInput(f"cannot tell whether SGLang accepts {FP4_FLAG} here: {python} could not parse the "
                       f"arguments with SGLang ({last[-1] if last else f'exit {r.returncode}'})")
    return json.loads(line.split(" ", 1)[1])


def fp4_platform_refusal(python: str, sglang_argv: list[str], env: Mapping[str, str]) -> str | None:
    """SGLang's refusal of an fp4 arm on this machine, as one line (its FP4_REASON), or None:
    asked of the server's Python before anything starts (module doc)."""
    probe = fp4_platform_probe(python, sglang_argv, env)
    if not probe["on"] or probe["supported"]:
        return None
    return (f"SGLang refuses the fp4 arm on this machine: {FP4_REASON} (DeepSeek-V4's MXFP4 index keys; "
            "on SM90, e.g. an H200, run fp8 and bf16 only)")


def stock_fp4_refusal(index_dtype: str, args) -> str | None:
    """A stock arm's parsed fp4 field must be its label: on in the fp4 arm, off in fp8."""
    if args is None:
        return None
    if not hasattr(args, FP4_FIELD):  # fail closed: not the SGLang this arm was written for
        return f"SGLang's ServerArgs has no field {FP4_FIELD!r}; niah's fp4 arm is written for SGLang 0.5.23"
    on = bool(getattr(args, FP4_FIELD))
    if on == (index_dtype == "fp4"):
        return None
    if on:
        return (f"the SGLang arguments turn {FP4_FLAG} on (a --config file?) in an {index_dtype} arm: "
                "set index_dtype = \"fp4\" instead")
    return f"the fp4 arm's arguments leave {FP4_FLAG} off in SGLang's parse (a --config file or a --no- flag?)"
