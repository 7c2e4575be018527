"""The index-key forms' table (niah.kernels.forms) is the one list: a form registered at run
time ("int8-test", its own reference quantiser) is accepted by `niah serve`'s option checks,
by the matrix file's keys (its SGLang arm described from its row in a live run's manifest),
judged by the attestation rules and labelled by the report, with no other module edited;
removed again, it is refused as before. The built-in rows keep the values every caller had
(names in order, bytes a token, the SGLang arms)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from niah.kernels import forms

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

NAME = "int8-test"
FIELD = "enable_int8_test_indexer"


def _int8_roundtrip(k: torch.Tensor) -> torch.Tensor:
    """int8 values, one fp32 scale a token (amax / 127)."""
    scale = k.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-4) / 127
    return (k.float() / scale).round().clamp(-127, 127) * scale


INT8 = forms.Form(NAME, lambda d: d + 4, "int8 values, one fp32 scale a token", _int8_roundtrip,
                  query=_int8_roundtrip, engines=(forms.CPU,), sglang_kernels=(forms.STOCK,),
                  sglang_flag="--enable-int8-test-indexer", sglang_field=FIELD, coarse=True)


def _niah(*args):
    from cli_inproc import niah

    return niah(*args, cwd=ROOT)


def test_the_built_in_rows_are_what_every_caller_had():
    from niah.serving.embedded import precision
    from niah.serving.sglang import arms

    assert forms.names() == ("fp8", "fp4", "bf16", "fp32")
    assert precision.index_dtypes() == ("fp8", "fp4", "bf16", "fp32", "fp8+bf16", "fp4+bf16")
    assert precision.query_dtypes() == ("fp32", "bf16", "fp8", "fp4")
    assert forms.names(forms.CUDA) == forms.names(forms.EXTERNAL) == ("fp8", "bf16", "fp32")
    assert arms.plugin_dtypes() == ("fp8", "bf16") and arms.arm_dtypes() == ("fp8", "fp4", "bf16")
    assert [forms.default_kernels(n) for n in ("fp8", "fp4", "bf16")] == ["stock", "stock", "niah"]
    assert {f.name: f.key_bytes(128) for f in forms.forms()} == {"fp8": 132, "fp4": 68, "bf16": 256, "fp32": 512}
    assert precision.key_bytes("fp8+bf16", 3, 64) == 3 * (68 + 128)
    assert [f.name for f in forms.forms() if f.query_differs] == ["fp4"]
    assert arms.FP4_FLAG == "--enable-deepseek-v4-fp4-indexer"


def test_a_registered_form_is_served_and_removed_again():
    from niah.kernels.quant import store_roundtrip
    from niah.serving.embedded import precision
    from niah.serving.embedded.selection import quantize_query

    k = torch.randn(5, 64)
    with forms.register_form(INT8) as form:
        assert form is forms.get(NAME) and forms.names()[-1] == NAME
        assert torch.equal(store_roundtrip(k, NAME), _int8_roundtrip(k))
        assert torch.equal(quantize_query(k, NAME), _int8_roundtrip(k))
        assert f"{NAME}+bf16" in precision.index_dtypes()
        assert precision.key_bytes(f"{NAME}+bf16", 3, 64) == 3 * (68 + 128)
        with pytest.raises(ValueError, match="already registered"):
            forms.register_form(INT8)
    assert forms.get(NAME) is None and NAME not in precision.index_dtypes()
    with pytest.raises(ValueError, match="unknown index dtype"):
        store_roundtrip(k, NAME)


def test_niah_serve_takes_a_registered_form():
    """The real CLI: the index dtype passes, the next check (--index-topk 0) is what refuses."""
    refused = _niah("serve", "--index-dtype", NAME, "--index-topk", "0")
    assert refused.returncode == 2 and f"--index-dtype must be one of fp8, fp4, bf16, fp32, fp8+bf16, fp4+bf16, " \
                                      f"not '{NAME}'" in refused.stderr
    with forms.register_form(INT8):
        for argv in (("--index-dtype", NAME), ("--index-dtype", f"{NAME}+bf16", "--rescore-factor", "2"),
                     ("--index-query-dtype", NAME)):
            r = _niah("serve", *argv, "--index-topk", "0")
            assert r.returncode == 2 and "--index-topk must be >= 1" in r.stderr, (argv, r.stderr)
        r = _niah("serve", "--index-dtype", NAME, "--device", "cuda")
        assert r.returncode == 2 and f"--index-dtype {NAME} is served on the CPU only" in r.stderr, r.stderr


MATRIX = f"""
[[config]]
name = "cpu"
engine = "embedded"
index_dtype = "{NAME}"
index_query_dtype = "{NAME}"

[[config]]
name = "two-stage"
engine = "embedded"
index_dtype = "{NAME}+bf16"

[[config]]
name = "stock"
engine = "sglang"
model_path = "m"
index_dtype = "{NAME}"
"""


def test_the_matrix_takes_a_registered_form(tmp_path):
    from niah.errors import BadInput
    from niah.serving.matrix import load_matrix
    from niah.serving.matrix.commands import server_command

    (tmp_path / "m.toml").write_text(MATRIX)
    with pytest.raises(BadInput, match=f"must be one of 'fp8', 'fp4', 'bf16', 'fp32', 'fp8\\+bf16', 'fp4\\+bf16', "
                                       f"not '{NAME}'"):
        load_matrix(tmp_path / "m.toml")
    with forms.register_form(INT8):
        m = load_matrix(tmp_path / "m.toml")
        assert [c.settings["index_dtype"] for c in m.configs] == [NAME, f"{NAME}+bf16", NAME]
        argv, _ = server_command(m.configs[2], 30000)
        assert "--enable-int8-test-indexer" in argv and argv[1:3] == ["-m", "sglang.launch_server"]
        (tmp_path / "n.toml").write_text(MATRIX + 'kernels = "niah"\n')  # the stock-only form on niah's
        with pytest.raises(BadInput, match="int8-test index keys run on SGLang's own kernels"):
            load_matrix(tmp_path / "n.toml")


def test_a_live_matrix_records_a_registered_forms_arm(tmp_path):
    """The arm a registered form makes is described from its row when a live run records the
    matrix (what a dry run never reads): its layout and bytes a token, SGLang's flag on a stock
    arm, niah's kernels on a plugin arm; a built-in arm keeps its own words."""
    from niah.runs.manifest import read_manifest
    from niah.runs.run import Run
    from niah.serving.matrix import load_matrix
    from niah.serving.matrix.run import manifest_matrix
    from niah.serving.sglang.command import ARMS
    from niah.sweep import SweepSpec

    plugin = forms.Form("int8-niah-test", lambda d: d + 4, "int8 values, one fp32 scale a token", _int8_roundtrip,
                        sglang_kernels=(forms.NIAH,))
    (tmp_path / "m.toml").write_text(MATRIX + '\n[[config]]\nname = "plugin"\nengine = "sglang"\nmodel_path = "m"\n'
                                     'index_dtype = "int8-niah-test"\n\n[[config]]\nname = "fp8"\n'
                                     'engine = "sglang"\nmodel_path = "m"\n')
    with forms.register_form(INT8), forms.register_form(plugin):
        with Run.open(tmp_path / "run", SweepSpec(lengths=[300], depths=[50]), resume=False) as run:
            manifest_matrix(run, load_matrix(tmp_path / "m.toml"))
    arms = read_manifest(tmp_path / "run")["matrix"]["arms"]
    assert arms["stock"]["arm"] == f"{NAME}/stock" and arms["stock"]["launcher"] == "sglang.launch_server"
    assert arms["stock"]["index_keys"] == "int8 values, one fp32 scale a token, 132 B/token, written by SGLang"
    assert arms["stock"]["paths"] == "SGLang's defaults plus --enable-int8-test-indexer"
    assert arms["plugin"]["arm"] == "int8-niah-test/niah" and arms["plugin"]["plugin"] == "loaded"
    assert arms["plugin"]["logits"] == "niah's int8-niah-test Triton kernels"
    assert arms["fp8"] == {"arm": "fp8/stock", **ARMS["fp8/stock"]}


def test_an_arm_the_table_does_not_make_is_refused_in_one_line():
    from niah.errors import BadInput
    from niah.serving.sglang.command import arm_facts

    with pytest.raises(BadInput, match="^sglang: no arm int4/stock: the forms table has no int4 index keys on stock "
                                       "kernels$"):
        arm_facts("int4", "stock")
    with forms.register_form(INT8), pytest.raises(BadInput, match=f"no arm {NAME}/niah"):
        arm_facts(NAME, "niah")


def _reading(**server_args) -> dict:
    return {"error": None, "internal_states": 2, "attested_states": 0, "attestation": None,
            "server_args": server_args}


def _stock_entry(dtype: str, **server_args) -> dict:
    r = _reading(**server_args)
    return {"engine": "sglang", "settings": {"index_dtype": dtype, "kernels": "stock"},
            "attestation": {"segments": [{"start": r, "end": copy.deepcopy(r)}]}}


def test_the_attestation_rules_judge_a_registered_form():
    from niah.attestation import INVALID, VALID, status

    assert status(_stock_entry("fp8", **{FIELD: True}))[0] == VALID  # not a form's argument yet
    with forms.register_form(INT8):
        state, reason = status(_stock_entry(NAME, **{FIELD: True}))
        assert state == VALID and f"{FIELD}=true in SGLang's own arguments" in reason, reason
        assert f"its {NAME} index keys and kernels are SGLang's" in reason
        assert status(_stock_entry(NAME, **{FIELD: False})) == (
            INVALID, f"labelled index_dtype {NAME} but its SGLang reports {FIELD}=False in its own arguments at the "
                     f"start (/server_info; {NAME} keys need {FIELD} true)")
        assert status(_stock_entry("fp8", **{FIELD: True})) == (
            INVALID, f"labelled index_dtype fp8 but its SGLang reports {FIELD}=true in its own arguments at the "
                     f"start ({NAME} index keys)")
        assert status(_stock_entry("fp4", enable_deepseek_v4_fp4_indexer=True))[0] == VALID


def test_the_report_labels_a_registered_form(tmp_path):
    """A run whose configuration ran the form (an embedded server's attestation saying so) is
    valid and labelled by it in the report."""
    from report_runs import make_run

    from niah.attestation import VALID, status
    from niah.runs.manifest import read_manifest, write_manifest

    run = make_run(tmp_path / "run", {"int8": {"index_dtype": NAME}, "fp8": {"index_dtype": "fp8"}},
                   lengths=(1024,), depths=(0.0, 100.0), trials=2)
    ran = read_manifest(ROOT / "results" / "h200-seed-sweep")["configs"]["fp8-k512"]
    entry = {k: copy.deepcopy(ran[k]) for k in ("engine", "axes", "settings", "attestation")}
    entry["axes"] = {"index_dtype": NAME}
    entry["settings"] = {**entry["settings"], "index_dtype": NAME}
    for seg in entry["attestation"]["segments"]:
        for r in (seg["start"], seg["end"]):
            r["attestation"]["index_dtype"] = NAME
    manifest = read_manifest(run)
    manifest["configs"]["int8"] = {**manifest["configs"]["int8"], **entry}
    write_manifest(run, manifest)
    with forms.register_form(INT8):
        assert status(read_manifest(run)["configs"]["int8"])[0] == VALID
        r = _niah("report", run, "--out", tmp_path / "out")
        assert r.returncode == 0, r.stderr
        md = (tmp_path / "out" / "summary.md").read_text()
        assert f"| `int8` | embedded | valid | {NAME}/niah-cuda |" in md, md
        assert f"(index_dtype: {NAME} -> fp8)" in md, md
