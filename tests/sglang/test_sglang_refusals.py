"""Refusals SGLang's way (serving/sglang/refusals.py): SGLang 0.5.23's own argument parser,
unpacked from the downloaded wheel, decides on the exact argv (abbreviations and --config
YAML files included); each refusal is one line and exit 2, before anything loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_source import sglang_tree, with_sglang


@pytest.fixture(scope="module")
def tree():
    return sglang_tree()


def _entry(args, env):
    return subprocess.run([sys.executable, "-m", "niah.serving.sglang", *args, "--model-path", "x"],
                          capture_output=True, text=True, env=env, timeout=600)


def _no_plugins_filter():
    return {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", "SGL_PLUGINS")}


BF16 = ["--niah-index-dtype", "bf16"]
FP8_NIAH = ["--niah-index-dtype", "fp8", "--niah-kernels", "niah"]


@pytest.mark.parametrize("args, env, line", [
    (BF16 + ["--enable-hier"], {},  # an argparse abbreviation
     "--enable-hierarchical-cache is not supported with bf16/niah index keys (HiCache: its host pool and "
     "transfers are sized for 132-byte fp8 keys)"),
    (BF16 + ["--config", "{yaml}"], {},  # HiCache switched on in a YAML config file
     "--enable-hierarchical-cache is not supported with bf16/niah index keys (HiCache: "),
    (FP8_NIAH + ["--dsa-paged-mqa-logits-backend", "cutedsl"], {},
     "--dsa-paged-mqa-logits-backend cutedsl is not supported with fp8/niah index keys (only auto/deepgemm "),
    (BF16 + ["--enable-prefill-cp"], {}, "--enable-prefill-cp is not supported with bf16/niah index keys (prefill "
                                         "context parallel: "),
    (FP8_NIAH + ["--disaggregation-mode", "prefill"], {},
     "--disaggregation-mode prefill is not supported with fp8/niah index keys (PD disaggregation: "),
    (BF16, {"SGLANG_PLUGINS": "other"},
     "SGLANG_PLUGINS='other' does not name 'niah', so SGLang would load its processes without niah's plugin"),
    (BF16, {"SGL_PLUGINS": "other"},  # SGLang renames SGL_* to SGLANG_* when it is imported
     "SGL_PLUGINS='other' (SGLang renames it to SGLANG_PLUGINS) does not name 'niah', so SGLang would load its "
     "processes without niah's plugin"),
    (FP8_NIAH, {"SGL_PLUGINS": "other", "SGLANG_PLUGINS": "niah"},  # SGLang copies SGL_PLUGINS over it
     "SGL_PLUGINS='other' (SGLang renames it to SGLANG_PLUGINS) does not name 'niah'"),
    (BF16 + ["--json-model-override-args", '{"index_topk": 512}', "--json-model-override-args",
             '{"index_topk": 2048}'], {},  # a later override replaces niah's in SGLang's parse
     "the SGLang arguments set --json-model-override-args to '{\"index_topk\": 2048}' (a later "
     "--json-model-override-args, an abbreviation or a --config file), over niah's '{\"index_topk\": 512}'"),
    (BF16 + ['--json-model-override-args={"index_topk": 512}', "--json-model-override-args",
             '{"index_topk": 512, "index_kpool": 1}'], {},
     "the SGLang arguments set --json-model-override-args to '{\"index_topk\": 512, \"index_kpool\": 1}'"),
], ids=["abbreviation", "config-yaml", "cutedsl", "prefill-cp", "disaggregation", "sglang-plugins", "sgl-plugins",
        "sgl-plugins-over-sglang-plugins", "later-override", "later-override-equals-form"])
def test_issue_cases_are_refused_by_the_launch_entry_in_one_line(tree, tmp_path, args, env, line):
    yaml = tmp_path / "srv.yaml"
    yaml.write_text("enable-hierarchical-cache: true\n")
    args = [a.replace("{yaml}", str(yaml)) for a in args]
    r = _entry(args, with_sglang(tree, _no_plugins_filter() | env))
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("niah: error: " + line), r.stderr


_DECIDE = textwrap.dedent("""
    import json, sys
    from niah.errors import BadInput
    from niah.serving.sglang import refusals
    out = []
    for dtype, kernels, argv in json.loads(sys.argv[1]):
        try:
            out.append(refusals.refusal(dtype, kernels, refusals.parse(argv)))
        except BadInput as e:
            out.append("BadInput: " + str(e))
    print(json.dumps(out))
""")


def _decide(tree, cases):
    r = subprocess.run([sys.executable, "-c", _DECIDE, json.dumps(cases)], capture_output=True, text=True,
                       env=with_sglang(tree), timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_rule_decides_on_the_parsed_fields(tree):
    from niah.serving.sglang import SGLangLaunch, build_sglang_command

    m = ["--model-path", "x"]
    built = {}
    for dtype, kernels in (("fp8", "niah"), ("bf16", "niah")):
        argv, _ = build_sglang_command(SGLangLaunch(model_path="x", index_dtype=dtype, kernels=kernels,
                                                    index_topk=512))
        built[dtype] = argv[argv.index("--model-path"):]  # what the entry hands SGLang
    cases = {
        "bf16 arm as niah builds it": ("bf16", "niah", built["bf16"]),
        "fp8/niah arm as niah builds it": ("fp8", "niah", built["fp8"]),
        "stock refuses nothing": ("fp8", "stock", m + ["--enable-hier", "--enable-prefill-cp"]),
        "deepgemm backend": ("fp8", "niah", m + ["--dsa-paged-mqa-logits-backend", "deepgemm"]),
        "spec bf16": ("bf16", "niah", m + ["--speculative-algorithm", "EAGLE"]),
        "spec fp8/niah": ("fp8", "niah", m + ["--speculative-algo", "EAGLE"]),
        "spec NONE": ("bf16", "niah", m + ["--speculative-algorithm", "NONE"]),
        "dcp alias": ("fp8", "niah", m + ["--decode-context-parallel-size", "2"]),
        "attn cp": ("bf16", "niah", m + ["--attn-cp-size", "2"]),
        "hisparse": ("bf16", "niah", m + ["--enable-hisparse"]),
        "layer split": ("bf16", "niah", m + ["--enable-dsa-cache-layer-split"]),
        "sharding": ("fp8", "niah", m + ["--enable-kv-cache-sharding"]),
        "v4 fp4": ("bf16", "niah", m + ["--enable-deepseek-v4-fp4-indexer"]),
        "kpool": ("bf16", "niah", m + ["--json-model-override-args", '{"index_kpool": 4}']),
        "hicache alias": ("bf16", "niah", m + ["--enable-hicache"]),
        "unknown flag": ("bf16", "niah", m + ["--no-such-flag"]),
    }
    got = dict(zip(cases, _decide(tree, list(cases.values()))))
    assert got["bf16 arm as niah builds it"] is None and got["fp8/niah arm as niah builds it"] is None
    assert got["stock refuses nothing"] is None and got["deepgemm backend"] is None
    assert got["spec bf16"].startswith("--speculative-algorithm EAGLE is not supported with bf16/niah")
    assert got["spec fp8/niah"] is None  # fp8 target-verify goes through the patched resolver
    assert got["spec NONE"] is None
    starts = {"dcp alias": "--dcp-size 2 is not supported with fp8/niah", "attn cp": "--attn-cp-size 2 is not",
              "hisparse": "--enable-hisparse is not", "layer split": "--enable-dsa-cache-layer-split is not",
              "sharding": "--enable-kv-cache-sharding is not", "v4 fp4": "--enable-deepseek-v4-fp4-indexer is not",
              "kpool": "index_kpool 4 (--json-model-override-args) is not supported with bf16/niah",
              "hicache alias": "--enable-hierarchical-cache is not"}
    for name, start in starts.items():
        assert got[name].startswith(start), (name, got[name])
    assert got["unknown flag"] == ("BadInput: SGLang's argument parser refused the arguments: sglang serve: error: "
                                   "unrecognized arguments: --no-such-flag")


def test_sglang_plugins_rule_matches_sglangs_own_loader(tree):
    """SGLang's load_plugins_by_group, run for real, loads niah's plugin exactly when
    refusals.plugins_refusal lets the arm through."""
    code = textwrap.dedent("""
        import json, os, sys
        from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group
        from niah.serving.sglang.refusals import plugins_refusal
        out = []
        for value in json.loads(sys.argv[1]):
            os.environ["SGLANG_PLUGINS"] = value
            out.append(["niah" in load_plugins_by_group(GENERAL_PLUGINS_GROUP),
                        plugins_refusal({"SGLANG_PLUGINS": value}) is None])
        print(json.dumps(out))
    """)
    values = ["", "other", "niah", "other, niah", ",", " niah ", "niahx"]
    r = subprocess.run([sys.executable, "-c", code, json.dumps(values)], capture_output=True, text=True,
                       env=with_sglang(tree, _no_plugins_filter()), timeout=600)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert [loaded for loaded, _ in got] == [True, False, True, True, False, True, False]
    assert all(loaded == allowed for loaded, allowed in got), dict(zip(values, got))


_LOADER = textwrap.dedent("""
    import json
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group
    print(json.dumps("niah" in load_plugins_by_group(GENERAL_PLUGINS_GROUP)))
""")


@pytest.mark.parametrize("env", [
    {"SGL_PLUGINS": "other"}, {"SGL_PLUGINS": "niah"}, {"SGL_PLUGINS": "other", "SGLANG_PLUGINS": "niah"},
    {"SGL_PLUGINS": "niah", "SGLANG_PLUGINS": "other"}, {"SGL_PLUGINS": "", "SGLANG_PLUGINS": "other"},
], ids=["sgl-other", "sgl-niah", "sgl-over-sglang", "sgl-niah-over-other", "sgl-empty-over-other"])
def test_legacy_sgl_plugins_rule_matches_sglangs_own_rename(tree, env):
    """SGLang's own import (srt/environ.py renames SGL_* to SGLANG_*) then its loader, run for
    real with the variables set before SGLang is imported: niah's plugin loads exactly when
    refusals.plugins_refusal lets the arm through."""
    from niah.serving.sglang.refusals import plugins_refusal

    r = subprocess.run([sys.executable, "-c", _LOADER], capture_output=True, text=True,
                       env=with_sglang(tree, _no_plugins_filter() | env), timeout=600)
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stdout.strip().splitlines()[-1])
    assert loaded == (plugins_refusal(env) is None), (env, loaded, plugins_refusal(env))
    assert loaded == (env["SGL_PLUGINS"] in ("niah", ""))


MATRIX = """
engine = "sglang"
model_path = "deepseek-ai/DeepSeek-V3.2"
args = ["--enable-hier"]

[axes]
index_dtype = ["fp8", "bf16"]
"""


def _dry_run(matrix, env):
    return subprocess.run([sys.executable, "-m", "niah", "sweep", "--matrix", str(matrix), "--dry-run"],
                          capture_output=True, text=True, env=env, timeout=600)


def test_matrix_dry_run_refuses_the_same_way_where_sglang_is_importable(tree, tmp_path):
    m = tmp_path / "m.toml"
    m.write_text(MATRIX)
    r = _dry_run(m, with_sglang(tree, _no_plugins_filter()))
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "bf16" in r.stderr and "--enable-hierarchical-cache is not supported with bf16/niah index keys" in r.stderr
    m.write_text(MATRIX.replace('args = ["--enable-hier"]', "args = []"))
    r = _dry_run(m, with_sglang(tree, _no_plugins_filter()))
    assert r.returncode == 0, r.stderr
    assert "# SGLang arguments: checked with SGLang's own parser here" in r.stdout


def test_matrix_dry_run_says_refusals_are_checked_at_launch_without_sglang(tmp_path):
    m = tmp_path / "m.toml"
    m.write_text(MATRIX)
    r = _dry_run(m, _no_plugins_filter())  # this environment has no SGLang
    assert r.returncode == 0, r.stderr
    assert ("# SGLang arguments: not checked here (SGLang is not installed in this environment "
            "(pip install sglang==0.5.23)); the launch entry checks them with SGLang's parser before weights "
            "load") in r.stdout
