"""Attestation that proves, or the comparison refuses: real sweeps against real HTTP servers
on loopback (tests/servers/tiny_server.py, which reports /server_info the way SGLang does:
internal_states[i]["niah_attestation"], or no attestation as when the plugin is absent),
then `niah compare`, `niah gate` and `niah report` as the CLI (exit codes matter).

The cases that used to pass unproven: an external configuration labelled bf16 against a server
with no /server_info, a /server_info that errors, a launched server that died before it
was asked, a niah arm whose SGLang reports no niah_attestation (SGLANG_PLUGINS kept the
plugin out); and a bf16 arm whose bf16 reads did not grow during the sweep."""

from __future__ import annotations

import json
import subprocess

import httpx
from lifecycle_helpers import ROOT, tiny_command, toml_list

from niah.serving.launch import ServerProcess
from niah.runs.manifest import read_manifest, write_manifest

# niah.attestation is imported inside the tests, after the CLI checks, so that on a niah
# without it (the parent commit) the tests fail on behaviour, not on an import.
SPEC = {"lengths": [200], "depths": [0.0, 100.0], "trials": 1}  # two chat requests per configuration
NOT_ATTESTED = "pass --accept-unattested to compare it on its labels' word"


def _niah(*args) -> subprocess.CompletedProcess:
    from cli_inproc import niah  # the entry point in this process (tests/cli_inproc.py)

    return niah(*args, cwd=ROOT)


def _one_line_2(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def _tiny(tmp_path, name: str, *flags: str) -> ServerProcess:
    argv = tiny_command(*flags)
    return ServerProcess(name, lambda port: ([a.replace("{port}", str(port)) for a in argv], {}),
                         log_path=tmp_path / "logs" / f"{name}.log")


def _sweep_matrix(tmp_path, text: str):
    from niah.serving.matrix import run_matrix
    from niah.sweep import SweepSpec

    (tmp_path / "m.toml").write_text(text)
    return run_matrix(tmp_path / "m.toml", SweepSpec(**SPEC), tmp_path / "run")


def _calls(path: str, dtype: str, kernel: str, n: int = 1) -> dict:
    return {path: {dtype: {kernel: {"eager": n, "captured": 0, "replayed": 0}}}}


BF16 = {"index_dtype": "bf16", "kernels": "niah", "pool_bytes_per_token": 256, "facts": {},
        "calls": _calls("store", "bf16", "niah.store_index_keys", 4)}   # warm-up stored 4 keys
BF16_PER_REQUEST = {**_calls("store", "bf16", "niah.store_index_keys", 200),
                    **_calls("prefill_logits", "bf16", "niah.bf16_mqa_logits"),
                    "decode_logits": {"bf16": {"niah.bf16_paged_mqa_logits": {"eager": 1, "replayed": 8}}}}
FP8_NIAH = {"index_dtype": "fp8", "kernels": "niah", "pool_bytes_per_token": 132, "facts": {}, "calls": {}}
FP8_PER_REQUEST = _calls("decode_logits", "fp8", "niah.fp8_paged_mqa_logits", 9)


def test_external_labels_without_server_info_are_refused_unless_accepted(tmp_path):
    """`external` labelled bf16 and fp8 against servers with no /server_info."""
    with _tiny(tmp_path, "a") as a, _tiny(tmp_path, "b") as b:
        run = _sweep_matrix(tmp_path, 'engine = "external"\n'
                            f'[[config]]\nname = "fp8"\nendpoint = "{a.endpoint}"\nindex_dtype = "fp8"\n'
                            f'[[config]]\nname = "bf16"\nendpoint = "{b.endpoint}"\nindex_dtype = "bf16"\n')
    line = _one_line_2(_niah("compare", run, "--a", "fp8", "--b", "bf16"))
    assert line.startswith(f"niah: error: {run}: configuration 'fp8' is unattested: labels index_dtype=fp8 are not "
                           "attested: its server reports no niah_attestation (/server_info at the end of the sweep: ")
    assert line.endswith(f"/server_info answered HTTP 404); {NOT_ATTESTED}")
    assert "configuration 'bf16' is unattested" in _one_line_2(
        _niah("gate", "--baseline", run, "--candidate", run, "--config", "bf16"))
    ok = _niah("compare", run, "--a", "fp8", "--b", "bf16", "--accept-unattested")
    assert ok.returncode == 0, ok.stderr
    assert "- attestation: `fp8` (" in ok.stdout and "is unattested, accepted with --accept-unattested" in ok.stdout
    ok = _niah("gate", "--baseline", run, "--candidate", run, "--accept-unattested")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "- note: `bf16` (run " in ok.stdout
    rep = _niah("report", run)
    assert rep.returncode == 0, rep.stderr
    assert "attestation: fp8, bf16 unattested" in rep.stdout
    assert ("| `bf16` | external | *unattested* | — | — | labels index_dtype=bf16"
            in (run / "report" / "summary.md").read_text())
    entry = read_manifest(run)["configs"]["bf16"]
    assert entry["attestation_verdict"]["state"] == "unattested"
    assert entry["attestation"]["segments"][0]["start"]["error"].endswith("/server_info answered HTTP 404")


def test_plain_sweeps_of_one_unlabelled_endpoint_need_no_flag(tmp_path):
    with _tiny(tmp_path, "plain") as srv:
        for name in ("a", "b"):
            r = _niah("sweep", "--endpoint", srv.endpoint, "--lengths", "200", "--depths", "0,100", "--trials", "1",
                      "-q", "--out", tmp_path / name)
            assert r.returncode == 0, r.stdout + r.stderr
    r = _niah("compare", tmp_path / "a", tmp_path / "b")
    assert r.returncode == 0 and "attestation" not in r.stdout, r.stdout + r.stderr
    assert _niah("gate", "--baseline", tmp_path / "a", "--candidate", tmp_path / "b").returncode == 0
    from niah.attestation import VALID, status

    assert status(read_manifest(tmp_path / "a")["configs"]["default"])[0] == VALID


def _command(name: str, att: dict | None, per_request: dict | None = None, *flags: str, label: str = "bf16") -> str:
    extra = (["--attestation", json.dumps(att)] if att else []) + (
        ["--attest-per-request", json.dumps(per_request)] if per_request else []) + list(flags)
    return f'\n[[config]]\nname = "{name}"\nindex_dtype = "{label}"\ncommand = {toml_list(tiny_command(*extra))}\n'


def test_launched_servers_must_prove_their_label_through_the_sweep(tmp_path):
    """Servers niah launches (engine "command") that report an attestation: a /server_info
    that errors at the end, a server that died before it was asked, a bf16 arm whose bf16
    reads did not grow (only warm-up), and one that contradicts its label, are INVALID."""
    run = _sweep_matrix(tmp_path, 'engine = "command"\n'
                        + _command("fp8", FP8_NIAH, FP8_PER_REQUEST, label="fp8")
                        + _command("bf16", BF16, BF16_PER_REQUEST)
                        + _command("bf16-500", BF16, BF16_PER_REQUEST, "--server-info-fail-after", "1")
                        + _command("bf16-died", BF16, BF16_PER_REQUEST, "--die-on-request", "2", "--die-with", "boom")
                        + _command("bf16-warmup-only", BF16)
                        + _command("bf16-read-fp8", BF16, {**BF16_PER_REQUEST, **FP8_PER_REQUEST}))
    configs = read_manifest(run)["configs"]
    why = {
        "bf16-500": "/server_info at the end of the sweep: http://127.0.0.1:{port}/server_info answered HTTP 500",
        "bf16-died": "/server_info at the end of the sweep: the server died before it was asked: {cause}",
        "bf16-warmup-only": "bf16 configured but no bf16 key was stored during the sweep",
        "bf16-read-fp8": "18 fp8 index-key path call(s) while bf16 was configured",
    }
    for name, reason in why.items():
        reason = reason.format(port=configs[name].get("port"), cause=configs[name].get("cause"))
        line = _one_line_2(_niah("compare", run, "--a", "fp8", "--b", name))
        assert line == f"niah: error: {run}: configuration {name!r} is INVALID: {reason}"
        # --accept-unattested does not accept an INVALID configuration
        line = _one_line_2(_niah("gate", "--baseline", run, "--candidate", run, "--config", name,
                                 "--accept-unattested"))
        assert line == f"niah: error: run {run}: configuration {name!r} is INVALID: {reason}"
    ok = _niah("compare", run, "--a", "fp8", "--b", "bf16")
    assert ok.returncode == 0, ok.stderr
    from niah.attestation import INVALID, VALID, status

    for name, reason in why.items():
        assert status(configs[name]) == (INVALID, reason.format(port=configs[name].get("port"),
                                                                cause=configs[name].get("cause"))), name
    seg = configs["bf16"]["attestation"]["segments"][0]
    assert seg["start"]["attestation"]["counts"] == {"store.bf16": 4}
    assert seg["end"]["attestation"]["counts"] == {"decode_logits.bf16": 18, "prefill_logits.bf16": 2,
                                                   "store.bf16": 404}
    assert status(configs["bf16"]) == (VALID, "bf16/niah, 256 B/token; during the sweep: store +400 "
                                              "(niah.store_index_keys); prefill_logits +2 (niah.bf16_mqa_logits); "
                                              "decode_logits +18 (niah.bf16_paged_mqa_logits)")
    assert configs["bf16"]["attestation_verdict"] == {"state": VALID, "reason": status(configs["bf16"])[1]}
    assert status(configs["fp8"])[0] == VALID
    assert configs["bf16-died"]["status"] == "died"
    rep = _niah("report", run)
    assert rep.returncode == 0, rep.stderr
    assert "attestation: bf16-500, bf16-died, bf16-warmup-only, bf16-read-fp8 INVALID" in rep.stdout
    summary = (run / "report" / "summary.md").read_text()
    assert "| `bf16-warmup-only` | command | **INVALID** | bf16/niah | 256 | bf16 configured but no bf16" in summary
    assert "| `bf16` | command | valid | bf16/niah | 256 |" in summary


def _sglang_run(tmp_path, arms: dict) -> tuple:
    """A run folder whose configurations are SGLang arms ({name: (label, tiny flags)}),
    each judged from its own loopback server, read before and after its trials; returns
    (run, its configs, {name: port})."""
    from report_runs import make_run

    from niah.attestation import begin_segment, end_segment, read_server
    from niah.runs.manifest import update_config

    run = make_run(tmp_path / "run", {n: {} for n in arms}, lengths=(1024,), depths=(50.0,), trials=2)
    manifest = read_manifest(run)
    for name, (label, _) in arms.items():
        manifest["configs"][name].update(engine="sglang", settings={"model_path": "deepseek-ai/DeepSeek-V3.2", **label})
    write_manifest(run, manifest)
    ports = {}
    for name, (_, flags) in arms.items():
        with _tiny(tmp_path, name, *flags) as srv:
            ports[name] = srv.port
            start = read_server(srv.endpoint)
            update_config(run, name, lambda entry: begin_segment(entry, start))
            for _ in range(2):  # its sweep
                httpx.post(srv.endpoint + "/v1/chat/completions", json={"messages": [
                    {"role": "user", "content": "The number is 4829163. What is it?"}]}, timeout=30).raise_for_status()
            end = read_server(srv.endpoint)
            update_config(run, name, lambda entry: end_segment(entry, end))
    return run, read_manifest(run)["configs"], ports


def test_sglang_arms_prove_the_plugin_ran_or_did_not(tmp_path):
    """The stock arm proves niah's plugin absent (internal_states without niah_attestation);
    a bf16 arm whose SGLang reports no niah_attestation (SGLANG_PLUGINS kept the plugin out
    of its scheduler processes) or whose /server_info errors is INVALID."""
    from niah.attestation import INVALID, VALID, status

    grow = ["--attestation", json.dumps(BF16), "--attest-per-request", json.dumps(BF16_PER_REQUEST)]
    run, configs, ports = _sglang_run(tmp_path, {
        "stock": ({"index_dtype": "fp8"}, ["--internal-states", "2"]),
        "bf16": ({"index_dtype": "bf16"}, [*grow, "--internal-states", "2"]),
        "bf16-plugin-kept-out": ({"index_dtype": "bf16"}, ["--internal-states", "2"]),
        "bf16-one-scheduler": ({"index_dtype": "bf16"}, [*grow, "--internal-states", "2", "--attested-states", "1"]),
        "bf16-500": ({"index_dtype": "bf16"}, [*grow, "--server-info-fail-after", "0"]),
        "stock-with-plugin": ({"kernels": "stock"}, ["--attestation", json.dumps(FP8_NIAH), "--internal-states", "2"]),
    })
    assert status(configs["stock"]) == (VALID, "SGLang's own paths: niah's plugin absent in all 2 scheduler(s) at "
                                               "start and end (its kernels are SGLang's, unattested beyond that)")
    assert status(configs["bf16"])[0] == VALID
    assert _niah("compare", run, "--a", "stock", "--b", "bf16").returncode == 0
    why = {
        "bf16-plugin-kept-out": "no niah_attestation in /server_info at the start: niah's plugin did not run in "
                                "SGLang's scheduler processes (SGLANG_PLUGINS set without niah?)",
        "bf16-one-scheduler": "niah_attestation in only 1 of 2 SGLang scheduler(s) at the start",
        "bf16-500": "/server_info at the end of the sweep: http://127.0.0.1:{port}/server_info answered HTTP 500",
        "stock-with-plugin": "niah's plugin ran in the stock arm (2 of 2 scheduler(s) report niah_attestation at the "
                             "start)",
    }
    for name, reason in why.items():
        reason = reason.format(port=ports[name])
        assert status(configs[name]) == (INVALID, reason), name
        line = _one_line_2(_niah("compare", run, "--a", "stock", "--b", name))
        assert line == f"niah: error: {run}: configuration {name!r} is INVALID: {reason}"
    line = _one_line_2(_niah("gate", "--baseline", run, "--candidate", run))
    assert line.startswith(f"niah: error: run {run}: configuration 'bf16-plugin-kept-out' is INVALID: ")


def test_an_exported_baseline_keeps_its_attestation(tmp_path):
    """`niah baseline export` carries engine, label and readings; the gate judges a
    baseline exactly as the run folder it came from, and a schema 1 baseline (no
    readings) is unattested."""
    from niah.attestation import INVALID

    run, _, _ = _sglang_run(tmp_path, {"bf16-plugin-kept-out": ({"index_dtype": "bf16"}, ["--internal-states", "1"])})
    base = tmp_path / "b.json"
    assert _niah("baseline", "export", run, "-o", base).returncode == 0
    data = json.loads(base.read_text())
    cfg = data["configs"]["bf16-plugin-kept-out"]
    assert data["schema_version"] == 2 and cfg["engine"] == "sglang" and cfg["settings"] == {"index_dtype": "bf16"}
    assert cfg["attestation_status"]["state"] == INVALID
    assert "is INVALID: no niah_attestation" in _one_line_2(_niah("gate", "--baseline", base, "--candidate", base))
    old = {**data, "schema_version": 1, "configs": {"x": {k: v for k, v in cfg.items() if k in (
        "model", "axes", "summary", "trials")} | {"axes": {"index_dtype": "bf16"}}}}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert "configuration 'x' is unattested: labels index_dtype=bf16" in _one_line_2(
        _niah("gate", "--baseline", tmp_path / "old.json", "--candidate", tmp_path / "old.json"))
    assert _niah("gate", "--baseline", tmp_path / "old.json", "--candidate", tmp_path / "old.json",
                 "--accept-unattested").returncode == 0
