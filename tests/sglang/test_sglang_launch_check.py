"""The plugin's launch-time contract check, run exactly as a server runs it, against each
supported release's real sources laid out as installed (tests/sglang_source.py sglang_tree:
the wheel's sglang/ package and its dist-info first on PYTHONPATH, so `find_spec("sglang")`
and importlib.metadata see that release as the installed SGLang).

What a server runs: `install` (from the launch entry, and from SGLang's plugin loader in
every spawned process: `sglang_plugin`) calls `check_installed`, the contract check over
the installed package's source with that release's own rows, then patches. On this CPU
machine SGLang's GPU stack is absent, so the first patch's import fails: the one line
naming that patch proves the check before it passed. The same check on the wheel
(AstSource, what test_sglang_contract.py runs) gives the same report.

Then what the launch entry decides before SGLang starts, on 0.5.16: its one-line refusal
where 0.5.16's parser cannot be imported (this machine), the matrix's check of a built
command, the refusal rules against 0.5.16's ServerArgs fields, and DeepSeek-V4 with niah's
kernels refused at launch on 0.5.16 (niah's V4 path is proven on 0.5.23 only)."""

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


# -- the rest of what the launch entry decides before SGLang starts, on 0.5.16 -----------------
# 0.5.16's argument parser cannot be imported on this CPU machine (sglang.srt.utils imports
# torchvision, whose PyPI build needs CUDA's libraries); the entry then refuses in one line,
# and what it would decide on that parser is checked on 0.5.16's own source.


def _config(tmp_path, arch: str):
    folder = tmp_path / arch
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": [arch]}))
    return folder


def test_the_launch_entry_on_0_5_16_fails_closed_in_one_line(tmp_path):
    from niah.serving.sglang.patches import patches_for

    model = _config(tmp_path, "DeepseekV32ForCausalLM")
    r = subprocess.run([sys.executable, "-m", "niah.serving.sglang", "--niah-index-dtype", "bf16", "--niah-kernels",
                        "niah", "--model-path", str(model)], capture_output=True, text=True, timeout=600,
                       env=_env("0.5.16"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    here = "niah: error: SGLang's argument parser cannot be imported here: "  # this machine: no torchvision
    first = f"niah: error: patching {patches_for('bf16', 'niah', '0.5.16')[0].target} failed: "  # with it
    assert r.stderr.startswith((here, first)), r.stderr
    # the matrix's check of a built command leaves it to the entry there, and still refuses the allow-list
    code = textwrap.dedent("""
        import json, sys
        from niah.errors import BadInput
        from niah.serving.sglang.refusals import check_command, installed_release
        argv = [sys.executable, "-m", "niah.serving.sglang", "--niah-index-dtype", "bf16", "--model-path", "x"]
        out = [installed_release(), check_command(argv, {})]
        try:
            check_command(argv, {"SGLANG_PLUGINS": "other"})
        except BadInput as e:
            out.append(str(e))
        print(json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env("0.5.16"), timeout=600)
    assert r.returncode == 0, r.stderr
    release, checked, refused = json.loads(r.stdout.splitlines()[-1])
    assert (release, checked) == ("0.5.16", False)
    assert refused.startswith("SGLANG_PLUGINS='other' does not name 'niah'")


def _server_args_fields(release: str) -> set[str]:
    """The fields of SGLang's ServerArgs dataclass, read from the release's server_args.py."""
    import ast

    from sglang_source import module_source

    tree = ast.parse(module_source(sglang_wheel(release), "sglang.srt.server_args"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def test_each_rule_names_a_field_of_0_5_16s_server_args_exactly_where_it_says_so():
    from niah.serving.sglang.refusals import RULES

    fields = _server_args_fields("0.5.16")
    for rule in RULES:
        assert (rule.field in fields) == (rule.releases is None or "0.5.16" in rule.releases), rule.field
    assert {"json_model_override_args", "model_path", "revision"} <= fields  # read by refusals.architecture


_V4 = textwrap.dedent("""
    import json, sys, types
    from niah.serving.sglang import refusals
    out = []
    for model in sys.argv[1:]:
        args = types.SimpleNamespace(model_path=model, json_model_override_args="{}", revision=None)
        out.append(refusals.v4_release_refusal(args))
    print(json.dumps(out))
""")


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_deepseek_v4_with_niahs_kernels_is_refused_at_launch_on_0_5_16_only(release, tmp_path):
    """Decided on the installed release's metadata and the model's config.json, with the
    ServerArgs fields architecture() reads (on 0.5.23, SGLang's own parse: test below)."""
    v4, v32 = _config(tmp_path, "DeepseekV4ForCausalLM"), _config(tmp_path, "DeepseekV32ForCausalLM")
    r = subprocess.run([sys.executable, "-c", _V4, str(v4), str(v32)], capture_output=True, text=True,
                       env=_env(release), timeout=600)
    assert r.returncode == 0, r.stderr
    on_v4, on_v32 = json.loads(r.stdout.splitlines()[-1])
    assert on_v32 is None
    if release == "0.5.23":
        assert on_v4 is None
    else:
        assert on_v4 == ("niah's DeepSeek-V4 path is proven on SGLang 0.5.23 only, not on the installed 0.5.16; "
                         "serve DeepSeek-V4 with fp8/stock, or use SGLang 0.5.23")


def test_deepseek_v4_passes_0_5_23s_own_parse(tmp_path):
    code = ("import sys\nfrom niah.serving.sglang import refusals\n"
            "a = refusals.check('bf16', 'niah', ['--model-path', sys.argv[1]], {})\n"
            "print(refusals.architecture(a), refusals.v4_release_refusal(a))\n")
    r = subprocess.run([sys.executable, "-c", code, str(_config(tmp_path, "DeepseekV4ForCausalLM"))],
                       capture_output=True, text=True, env=_env("0.5.23"), timeout=600)
    assert r.returncode == 0 and r.stdout.split() == ["DeepseekV4ForCausalLM", "None"], r.stdout + r.stderr
