"""Launch entry: `python -m niah.serving.sglang [--niah-index-dtype fp8|bf16] <sglang args>`.

Installs niah's plugin (contract check first; refuses with one line and exit 2 if the
installed SGLang does not match), exports NIAH_INDEX_DTYPE so SGLang's spawned
processes install it too (through the `sglang.srt.plugins` entry point), then runs
SGLang's own `sglang.launch_server` with the remaining arguments.
"""

from __future__ import annotations

import os
import runpy
import sys

from niah.errors import BadInput, NiahError

NIAH_FLAG = "--niah-index-dtype"


def split_niah_args(argv: list[str]) -> tuple[str, list[str]]:
    """(index dtype, argv without niah's flags). Default dtype: $NIAH_INDEX_DTYPE or fp8."""
    dtype = os.environ.get("NIAH_INDEX_DTYPE") or "fp8"
    rest: list[str] = []
    it = iter(range(len(argv)))
    for i in it:
        a = argv[i]
        if a == NIAH_FLAG:
            if i + 1 >= len(argv):
                raise BadInput(f"{NIAH_FLAG} needs a value (fp8 or bf16)")
            dtype = argv[i + 1]
            next(it)
        elif a.startswith(NIAH_FLAG + "="):
            dtype = a.split("=", 1)[1]
        else:
            rest.append(a)
    return dtype, rest


def main(argv: list[str] | None = None) -> None:
    from niah.serving.sglang.plugin import SGLANG_INDEX_DTYPES, entry_point_registered, install

    try:
        dtype, rest = split_niah_args(list(sys.argv[1:] if argv is None else argv))
        if dtype not in SGLANG_INDEX_DTYPES:
            raise BadInput(f"{NIAH_FLAG}: {dtype!r} is not one of {', '.join(SGLANG_INDEX_DTYPES)}")
        if not entry_point_registered():
            raise BadInput("niah is not pip-installed in this Python environment, so SGLang's "
                           "model processes would start without its plugin; run "
                           "`pip install -e <niah checkout>` here first")
        os.environ["NIAH_INDEX_DTYPE"] = dtype
        install(dtype)
    except NiahError as e:
        print(f"niah: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    sys.argv = ["sglang.launch_server", *rest]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
