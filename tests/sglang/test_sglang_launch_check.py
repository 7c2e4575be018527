"""The plugin's launch-time contract check, run exactly as a server runs it, against each
supported release's real sources laid out as installed (tests/sglang_source.py sglang_tree:
the wheel's sglang/ package and its dist-info first on PYTHONPATH, so `find_spec("sglang")`
and importlib.metadata see that release as the installed SGLang).

What a server runs: `install` (from the launch entry, and from SGLang's plugin loader in
every spawned process: `sglang_plugin`) calls `check_installed`, the contract check over
the installed package's source with that release's own rows, then patches. On this CPU
machine SGLang's GPU stack is absent, so the first patch's import fails: the one line
naming that patch proves the check before it passed. The same check on the wheel
(AstSource, what test_sglang_contract.py runs) gives the same report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_source import SGLANG_RELEASES, sglang_tree, sglang_wheel, with_sglang

ARMS = (("bf16", "niah"), ("fp8", "niah"))

_CHECK = textwrap.dedent("""
    import json, sys
    from niah.serving.sglang.plugin import check_installed
    out = []
    for dtype, kernels in json.loads(sys.argv[1]):
        release, report = check_installed(dtype, kernels)
        out.append([release, report.version, report.source, report.checked, report.problems, report.summary()])
    print(json.dumps(out))
""")


def _env(release: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", "SGL_PLUGINS", "NIAH_INDEX_DTYPE",
                                                           "NIAH_KERNELS")}
    return with_sglang(sglang_tree(release), env) | extra


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_the_launch_time_check_passes_on_each_installed_release_with_its_own_rows(release):
    from niah.serving.sglang.contract import AstSource, check_contract
    from niah.serving.sglang.patches import points_for

    r = subprocess.run([sys.executable, "-c", _CHECK, json.dumps(ARMS)], capture_output=True, text=True,
                       env=_env(release), timeout=600)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    for (dtype, kernels), (rel, version, source, checked, problems, summary) in zip(ARMS, got):
        assert (rel, version, source, problems) == (release, release, "installed sglang", []), summary
        points = points_for(dtype, kernels, release)
        assert checked == len(points)
        # the check the tests run on the wheel, with the same rows, says the same
        on_wheel = check_contract(AstSource(sglang_wheel(release)), points)
        assert on_wheel.ok and on_wheel.checked == checked
        assert summary == on_wheel.summary().replace(str(sglang_wheel(release)), "installed sglang")


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_the_plugin_entry_passes_the_check_and_fails_closed_at_the_first_import(release):
    """`sglang_plugin()` as SGLang's loader calls it in each process (NIAH_* set by the launch
    entry): the check passes, patching starts with that release's first bf16/niah patch, whose
    module cannot be imported without SGLang's GPU stack: one line naming it, exit 2."""
    from niah.serving.sglang.patches import patches_for

    first = patches_for("bf16", "niah", release)[0].target
    code = "from niah.serving.sglang.plugin import sglang_plugin\nsglang_plugin()\nprint('served anyway')\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env=_env(release, NIAH_INDEX_DTYPE="bf16", NIAH_KERNELS="niah"))
    assert r.returncode == 2 and "served anyway" not in r.stdout, r.stdout + r.stderr
    ours = [line for line in r.stderr.splitlines() if line.startswith("niah:")]
    assert len(ours) == 1 and r.stderr.rstrip().endswith(ours[0]), r.stderr
    assert ours[0].startswith(f"niah: error: patching {first} failed: ModuleNotFoundError: "), ours[0]
    assert "does not fit" not in r.stderr
