"""SGLang's own fp4 arm (serving/sglang/fp4.py, command.py): the stock command with
`--enable-deepseek-v4-fp4-indexer` and nothing else; a V4 matrix with fp8 and fp4 dry-runs
into two stock commands that differ only in that flag; SGLang's refusal of the flag off
SM100/SM120/gfx95 is niah's, word for word from the wheel, before any server starts (this CPU
machine is such a machine: SGLang's own platform probe decides); the label is proven from
SGLang's own arguments in /server_info; the plugin's arms keep refusing fp4 pools."""

from __future__ import annotations

import os
import re
import stat
import sys

import pytest
from cli_inproc import niah
from sglang_source import module_source, sglang_tree, sglang_wheel

from niah.attestation import INVALID, VALID, status
from niah.attestation.readings import reading_of
from niah.errors import BadInput
from niah.serving.sglang import SGLangLaunch, build_sglang_command
from niah.serving.sglang.fp4 import FP4_REASON, stock_fp4_refusal

FLAG = "--enable-deepseek-v4-fp4-indexer"
V4 = """engine = "sglang"
model_path = "deepseek-ai/DeepSeek-V4-Flash"
tp = 8
args = ["--mem-fraction-static", "0.85", "--trust-remote-code"]
{python}
[axes]
index_dtype = ["fp8", "fp4"]
index_topk = [512]
"""


def test_fp4_arm_is_the_stock_command_plus_the_flag():
    fp8, env8 = build_sglang_command(SGLangLaunch(model_path="m", index_dtype="fp8", index_topk=512,
                                                  extra_args=["--trust-remote-code"]), environ={})
    fp4, env4 = build_sglang_command(SGLangLaunch(model_path="m", index_dtype="fp4", index_topk=512,
                                                  extra_args=["--trust-remote-code"]), environ={})
    assert fp4[1:3] == ["-m", "sglang.launch_server"] and env4 == env8 == {}
    assert [a for a in fp4 if a != FLAG] == fp8 and fp4.count(FLAG) == 1
    with pytest.raises(BadInput, match="fp4 index keys run on SGLang's own kernels only"):
        build_sglang_command(SGLangLaunch(model_path="m", index_dtype="fp4", kernels="niah"))
    for arg in (FLAG, "--enable-deepseek-v4-fp4", FLAG + "=true"):  # the flag, an abbreviation
        with pytest.raises(BadInput, match='use index_dtype = "fp4"'):
            build_sglang_command(SGLangLaunch(model_path="m", index_dtype="fp8", extra_args=[arg]))


def test_v4_matrix_dry_runs_into_two_stock_commands_one_flag_apart(tmp_path):
    m = tmp_path / "v4.toml"
    m.write_text(V4.format(python=""))
    r = niah("sweep", "--matrix", m, "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "-m sglang.launch_server" in ln]
    assert len(lines) == 2 and "-m niah.serving.sglang" not in r.stdout
    fp8, fp4 = (ln.split() for ln in lines)
    assert FLAG not in fp8 and [a for a in fp4 if a != FLAG] == fp8
    assert "# index_dtype: fp8-k512 -> fp4-k512: 1 difference: + --enable-deepseek-v4-fp4-indexer" in r.stdout
    assert "# arm fp4/stock: keys MXFP4" in r.stdout
    # fp4 keys on niah's kernels is no arm: an [axes] cross leaves it out, a listed config is refused
    m.write_text(V4.format(python="") + '\n[[config]]\nname = "x"\nindex_dtype = "fp4"\nkernels = "niah"\n')
    r = niah("sweep", "--matrix", m, "--dry-run")
    assert r.returncode == 2 and "fp4 index keys run on SGLang's own kernels" in r.stderr


def test_the_refusal_is_sglangs_own_check():
    """FP4_REASON and the condition are SGLang 0.5.23's (arg_groups/serving_hook.py)."""
    text = module_source(sglang_wheel(), "sglang.srt.arg_groups.serving_hook")
    flat = re.sub(r'"\s+"', "", re.sub(r"\s+", " ", text))  # its message is split over two literals
    assert (f'if cfg.enable_deepseek_v4_fp4_indexer and not ( get_platform().is_sm100 or get_platform().is_sm120 '
            f'or is_gfx95_supported() ): raise ValueError( "{FP4_REASON}" )') in flat


def test_sweep_refuses_the_fp4_arm_before_any_server_starts(tmp_path):
    """The server's Python (here: one with SGLang 0.5.23's sources, niah's own has none) parses
    the argv and asks SGLang's platform probe; on this CPU machine SGLang would refuse the flag."""
    wrapper = tmp_path / "sglang-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{sglang_tree()}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    m = tmp_path / "v4.toml"
    m.write_text(V4.format(python=f'python = "{wrapper}"'))
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = niah("sweep", "--matrix", m, "--out", out, "--lengths", "1000", env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        f"niah: error: fp4-k512 (line 6): SGLang refuses the fp4 arm on this machine: {FP4_REASON} (DeepSeek-V4's "
        "MXFP4 index keys; on SM90, e.g. an H200, run fp8 and bf16 only)"]
    assert not out.exists(), "nothing may start (or be written) before the refusal"


class Parsed:
    def __init__(self, **fields):
        self.__dict__.update(fields)


def test_a_stock_arms_parsed_fp4_field_must_be_its_label():
    assert stock_fp4_refusal("fp4", Parsed(enable_deepseek_v4_fp4_indexer=True)) is None
    assert stock_fp4_refusal("fp8", Parsed(enable_deepseek_v4_fp4_indexer=False)) is None
    assert "in an fp8 arm: set index_dtype" in stock_fp4_refusal("fp8", Parsed(enable_deepseek_v4_fp4_indexer=True))
    assert "leave --enable-deepseek-v4-fp4-indexer off" in stock_fp4_refusal(
        "fp4", Parsed(enable_deepseek_v4_fp4_indexer=False))
    assert "no field 'enable_deepseek_v4_fp4_indexer'" in stock_fp4_refusal("fp4", Parsed())


def _sglang_info(fp4):
    body = {"internal_states": [{}, {}], "version": "0.5.23"}
    if fp4 is not None:
        body["enable_deepseek_v4_fp4_indexer"] = fp4
    return reading_of(body)


def _entry(label, start, end):
    return {"engine": "sglang", "axes": label, "attestation": {"segments": [{"start": start, "end": end}]}}


def test_the_stock_label_is_proven_from_sglangs_own_arguments():
    on, off, silent = _sglang_info(True), _sglang_info(False), _sglang_info(None)
    assert on["server_args"] == {"enable_deepseek_v4_fp4_indexer": True}
    assert status(_entry({"index_dtype": "fp4"}, on, on)) == (
        VALID, "SGLang's own paths: niah's plugin absent in all 2 scheduler(s) at start and end; "
               "enable_deepseek_v4_fp4_indexer=true in SGLang's own arguments at start and end (its fp4 index keys "
               "and kernels are SGLang's, unattested beyond that)")
    assert status(_entry({"index_dtype": "fp8"}, off, off))[0] == VALID
    assert status(_entry({"index_dtype": "fp8"}, silent, silent))[0] == VALID  # an SGLang without the field
    assert status(_entry({"index_dtype": "fp4"}, on, off)) == (
        INVALID, "labelled index_dtype fp4 but its SGLang reports enable_deepseek_v4_fp4_indexer=False in its own "
                 "arguments at the end (/server_info; fp4 keys need enable_deepseek_v4_fp4_indexer true)")
    assert status(_entry({"index_dtype": "fp4"}, silent, on))[1].startswith(
        "labelled index_dtype fp4 but its SGLang does not report it in its own arguments at the start")
    assert status(_entry({"index_dtype": "fp8"}, off, on)) == (
        INVALID, "labelled index_dtype fp8 but its SGLang reports enable_deepseek_v4_fp4_indexer=true in its own "
                 "arguments at the end (fp4 index keys)")


def test_the_plugins_arms_keep_refusing_fp4():
    r = niah_entry(["--niah-index-dtype", "fp4", "--model-path", "x"])
    assert r == "niah: error: --niah-index-dtype: 'fp4' is not one of fp8, bf16"


def niah_entry(argv):
    import contextlib
    import io

    from niah.serving.sglang.__main__ import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return err.getvalue().strip()
