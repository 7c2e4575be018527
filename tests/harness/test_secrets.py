"""No secret on disk: a bearer token given to niah never lands in a run folder, its report,
its baseline or its export, whichever way it was given; launched servers' logs and the
manifest's matrix record mask it too. Real sweeps against the oracle server, which refuses
any request without the token (so the sweep really used it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from niah.redact import MASK, redact_argv, redact_env, redact_text
from niah.runs.trials import load_run

TOKEN = "sk-niah-test-7c1f0e9a2b"
ORACLE = Path(__file__).resolve().parents[1] / "servers" / "oracle.py"


def niah(*args, env=None):
    return subprocess.run([sys.executable, "-m", "niah", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def files_holding(root: Path, secret: str) -> list[str]:
    """Every file under `root` (hidden ones included) whose bytes contain `secret`."""
    return [str(p) for p in sorted(root.rglob("*")) if p.is_file() and secret.encode() in p.read_bytes()]


def test_api_key_given_any_way_is_on_no_file_of_the_run_its_report_baseline_or_export(oracle_factory, tmp_path):
    srv = oracle_factory("--api-key", TOKEN)
    common = ["--endpoint", srv.url, "--lengths", "300", "--depths", "0,100", "-q"]
    runs = {"flag": (["--api-key", TOKEN], None), "inline": ([f"--api-key={TOKEN}"], None),
            "env": ([], {"NIAH_API_KEY": TOKEN, "OPENAI_API_KEY": TOKEN})}
    for name, (key_args, env) in runs.items():
        out = tmp_path / name
        r = niah("sweep", *common, "--trials", "1", "--out", out, *key_args, env=env)
        assert r.returncode == 0, r.stderr
        manifest, recs = load_run(out)
        assert [x["outcome"] for x in recs] == ["correct", "correct"]  # the token was used
        if key_args:  # the command is recorded, with the token masked
            masked = ["--api-key", MASK] if name == "flag" else [f"--api-key={MASK}"]
            assert manifest["command"][-len(masked):] == masked
            assert json.loads((out / ".niah.lock").read_text())["command"][-len(masked):] == masked
        assert files_holding(out, TOKEN) == [], name
    out = tmp_path / "flag"
    r = niah("sweep", *common, "--trials", "2", "--out", out, "--resume", "--api-key", TOKEN)  # a second lock
    assert r.returncode == 0 and len(load_run(out)[1]) == 4, r.stderr
    assert niah("report", out).returncode == 0
    assert niah("baseline", "export", out, "-o", out / "baseline.json").returncode == 0
    assert niah("export", out).returncode == 0
    assert (out / "report" / "summary.md").is_file() and (out / "trials.csv").is_file()
    assert files_holding(out, TOKEN) == []


# the oracle behind `python -c`: its argv carries a token that it never sees (a command
# line as a real server's would: `--api-key TOKEN`), and niah needs none to talk to it
WRAPPED = ("import runpy, sys; port = sys.argv[1]; sys.argv = [{oracle!r}, '--port', port]; "
           "runpy.run_path({oracle!r}, run_name='__main__')")


def test_a_launched_servers_log_and_the_matrix_record_mask_its_tokens(oracle_factory, tmp_path, monkeypatch):
    """A launched server (engine "command") with a token in its argv and in its environment
    table, and an external server keyed through api_key_env (a variable with no
    secret-looking name): the launch log's header, the manifest's server command and env,
    and the recorded matrix file mask every one; the dry run prints none."""
    from niah.serving.matrix import run_matrix
    from niah.sweep import SweepSpec

    keyed = oracle_factory("--api-key", TOKEN)
    monkeypatch.setenv("ORACLE_KEY", TOKEN)
    argv = [sys.executable, "-c", WRAPPED.format(oracle=str(ORACLE)), "{port}", "--api-key", TOKEN]
    matrix = tmp_path / "m.toml"
    matrix.write_text('[[config]]\nname = "launched"\nengine = "command"\n'
                      f"command = {json.dumps(argv)}\n"
                      f'env = {{ HF_TOKEN = "{TOKEN}" }}\n'
                      f'\n[[config]]\nname = "external"\nengine = "external"\nendpoint = "{keyed.url}"\n'
                      'api_key_env = "ORACLE_KEY"\n')
    run = tmp_path / "run"
    run_matrix(matrix, SweepSpec(lengths=[300], depths=[50.0], trials=1), run)
    manifest, recs = load_run(run)
    assert sorted((r["config"], r["outcome"]) for r in recs) == [("external", "correct"), ("launched", "correct")]
    logs = sorted(run.rglob("*.log"))
    assert logs, sorted(map(str, run.rglob("*")))
    header = logs[0].read_text().splitlines()[0]
    assert f"--api-key {MASK}" in header and f"HF_TOKEN={MASK}" in header, header
    assert TOKEN in matrix.read_text() and MASK in manifest["matrix"]["text"]
    assert files_holding(run, TOKEN) == []
    r = niah("sweep", "--matrix", matrix, "--dry-run", env={"ORACLE_KEY": TOKEN})
    assert r.returncode == 0 and MASK in r.stdout and TOKEN not in r.stdout, r.stdout + r.stderr


def test_redaction_rules():
    argv = ["niah", "sweep", "--api-key", "k1-secret", "--max-tokens", "32", "--tokenizer", "server",
            "--hf-token=hf_abcdef", "-H", "Authorization: Bearer tok-12345", "--index-topk", "2048"]
    assert redact_argv(argv) == ["niah", "sweep", "--api-key", MASK, "--max-tokens", "32", "--tokenizer", "server",
                                 f"--hf-token={MASK}", "-H", f"Authorization: Bearer {MASK}", "--index-topk", "2048"]
    env = {"OPENAI_API_KEY": "k2-secret", "NIAH_INDEX_DTYPE": "bf16", "SGLANG_PLUGINS": None, "DB_PASSWORD": "pw12"}
    assert redact_env(env) == {"OPENAI_API_KEY": MASK, "NIAH_INDEX_DTYPE": "bf16", "SGLANG_PLUGINS": None,
                               "DB_PASSWORD": MASK}
    # a value known from a secret-named variable is masked wherever it is quoted
    assert redact_text("curl -u user:k2-secret http://x", env) == f"curl -u user:{MASK} http://x"


def test_headers_and_extra_body_reach_the_server_on_every_request_and_secret_values_stay_off_disk(
        oracle_factory, tmp_path):
    """--header and --extra-body, against the oracle that records what it received: every
    request (probes, counter, attestation read, trials) carries the headers, every
    generation request the extra body; `chat_template_kwargs: {thinking: true}` makes the
    oracle's template longer, so exact lengths prove the counter saw it too. The manifest
    records both, the secret header's value and the body's `api_key` masked; no file holds them."""
    import httpx

    from cli_inproc import niah as inproc

    secret, body_secret = "hdr-secret-9e8d7c6b5a", "body-secret-5f4e3d2c1b"
    srv = oracle_factory()
    body = {"chat_template_kwargs": {"thinking": True}, "top_k": 1, "metadata": {"api_key": body_secret}}
    for counter in ("server", "usage"):
        out = tmp_path / counter
        before = len(httpx.get(srv.url[:-3] + "/seen", timeout=10).json())
        r = inproc("sweep", "--endpoint", srv.url, "--lengths", "300,600", "--depths", "0,100", "--trials", "1",
                   "--tokenizer", counter, "-q", "--out", out, "-H", f"X-Api-Key: {secret}",
                   "--header", "X-Team: ml", "--extra-body", json.dumps(body))
        assert r.returncode == 0, r.stderr
        seen = httpx.get(srv.url[:-3] + "/seen", timeout=10).json()[before:]
        assert seen and all(s["headers"].get("x-api-key") == secret and s["headers"].get("x-team") == "ml"
                            for s in seen), counter
        gen = [s for s in seen if s["path"].endswith("/completions")]
        assert gen and all(s["body"].get("chat_template_kwargs") == {"thinking": True} and s["body"]["top_k"] == 1
                           for s in gen)
        manifest, recs = load_run(out)
        assert [x["outcome"] for x in recs] == ["correct"] * 4
        assert all(x["prompt_tokens"] == x["length"] for x in recs), [(x["length"], x["prompt_tokens"]) for x in recs]
        recorded = {**body, "metadata": {"api_key": MASK}}
        assert manifest["configs"]["default"]["request"] == {"headers": {"X-Api-Key": MASK, "X-Team": "ml"},
                                                             "extra_body": recorded}
        assert f"X-Api-Key: {MASK}" in manifest["command"]
        assert files_holding(out, secret) == [] and files_holding(out, body_secret) == [], counter


def test_header_redaction_rules():
    from niah.client import parse_headers, pass_through, request_headers
    from niah.redact import is_secret_header, remember_headers
    from niah.sweep.targets import pass_through_record

    assert [n for n in ("Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "api-key", "X-Auth-Token",
                        "X-Team", "Accept", "X-Request-Id", "Keep-Alive") if is_secret_header(n)] == \
        ["Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "api-key", "X-Auth-Token"]
    headers = parse_headers(["Authorization: Basic dXNlcjpwYXNzd29yZA==", "X-Team: ml"])
    remember_headers(headers)  # as the command line does, once parsed
    with pass_through(headers, {"seed": 1}):
        # a pass-through Authorization replaces the bearer token of --api-key
        assert request_headers("sk-from-flag") == headers
        assert pass_through_record() == {"headers": {"Authorization": MASK, "X-Team": "ml"}, "extra_body": {"seed": 1}}
    assert request_headers("k") == {"Authorization": "Bearer k"} and pass_through_record() is None
    assert redact_text("sent dXNlcjpwYXNzd29yZA== along") == f"sent {MASK} along"  # remembered once parsed
    assert redact_argv(["niah", "--header=Cookie: sid=abc", "-H", "X-Team: ml"]) == \
        ["niah", f"--header=Cookie: {MASK}", "-H", "X-Team: ml"]
