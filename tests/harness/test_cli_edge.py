"""The command line's edge: every error meant for the user is one line on stderr and an exit
code (2 for bad input and usage), never a traceback or a box; `--version`; help that keeps
its bracketed words; `--resume` that refuses what it cannot resume; failed replies' bodies on
one line; progress lines without a terminal; `niah serve` without its extra.

In-process (typer's CliRunner on niah.cli's app) where the process boundary is not the
behaviour; real loopback servers; a real subprocess for the missing-extra refusal."""

import asyncio
import io
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from niah.cli import _register, app
from report_runs import make_run

_register()


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_2(result) -> str:
    """The result is exit 2 with exactly one line on stderr, `niah: error: ...`."""
    err = result.stderr
    assert result.exit_code == 2, (result.exit_code, result.stdout, err, result.exception)
    assert len(err.splitlines()) == 1 and err.startswith("niah: error: "), err
    assert "Traceback" not in err and "╭" not in err
    return err.strip()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("cli") / "run", lengths=(1024,), depths=(0.0, 100.0), trials=2)


# -- --version, usage errors, help -------------------------------------------------------------
def test_version_from_its_one_place():
    import niah

    r = cli("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"niah {niah.__version__}"


@pytest.mark.parametrize("args, words", [
    (("sweep", "--trials", "abc"), "Invalid value for '--trials'"),
    (("sweep", "--no-such-option"), "No such option: --no-such-option"),
    (("report",), "Missing argument"),
    (("gate", "--baseline", "x"), "Missing option '--candidate'"),
    (("no-such-command",), "No such command"),
])
def test_usage_errors_are_one_line_exit_2(args, words):
    line = one_line_2(cli(*args))
    assert words in line and "--help" in line


def test_no_command_prints_the_help():
    r = cli()
    assert r.exit_code == 2 and "Commands:" in r.stdout and "sweep" in r.stdout and r.stderr == ""


def test_help_keeps_bracketed_words():
    assert "[default: RUN/report]" in " ".join(cli("report", "--help").stdout.split())
    assert "[default: A again, with --a/--b]" in " ".join(cli("compare", "--help").stdout.split())
    assert "[default: all in common]" in " ".join(cli("gate", "--help").stdout.split())


# -- unwritable outputs --------------------------------------------------------------------------
def test_every_unwritable_output_is_one_line_exit_2(run, tmp_path):
    afile = tmp_path / "a-file"
    afile.write_text("")
    cases = [
        (("report", run, "--out", afile), f"cannot write {afile}"),
        (("report", run, "--out", "/proc/niah-report"), "cannot write /proc/niah-report"),
        (("report", run, "-o", afile / "sub"), f"cannot write {afile / 'sub'}"),
        (("baseline", "export", run, "-o", afile / "b.json"), f"cannot write {afile / 'b.json'}"),
        (("baseline", "export", run, "-o", "/proc/niah/b.json"), "cannot write /proc/niah/b.json"),
        (("compare", run, run, "--markdown", tmp_path), f"cannot write {tmp_path}"),
        (("compare", run, run, "--markdown", "/proc/niah.md"), "cannot write /proc/niah.md"),
        (("export", run, "--out", tmp_path), f"cannot write {tmp_path}"),
        (("export", run, "--out", "/proc/niah.csv"), "cannot write /proc/niah.csv"),
        (("gate", "--baseline", run, "--candidate", run, "--summary", tmp_path), f"cannot write {tmp_path}"),
        (("sweep", "--endpoint", "http://127.0.0.1:9/v1", "--out", afile, "--resume"), "nothing to resume"),
    ]
    for args, words in cases:
        assert words in one_line_2(cli(*args)), args
    assert afile.read_text() == ""


def test_a_sweep_onto_a_file_is_one_line_exit_2(oracle, tmp_path):
    afile = tmp_path / "a-file"
    afile.write_text("")
    line = one_line_2(cli("sweep", "--endpoint", oracle.url, "--lengths", "300", "--depths", "50",
                          "--trials", "1", "--out", afile, "-q"))
    assert "cannot write" in line and str(afile) in line


# -- --resume ---------------------------------------------------------------------------------
def test_resume_of_a_missing_folder_refuses_and_creates_nothing(oracle, tmp_path):
    missing = tmp_path / "typo"
    args = ["sweep", "--endpoint", oracle.url, "--lengths", "300", "--depths", "50", "--trials", "1", "-q"]
    line = one_line_2(cli(*args, "--out", missing, "--resume"))
    assert f"--resume: {missing} does not exist" in line
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    assert "is not a niah run folder" in one_line_2(cli(*args, "--out", tmp_path / "empty", "--resume"))
    assert "--resume needs --out" in one_line_2(cli(*args, "--resume"))
    # the library refuses too (a matrix sweep opens the same niah.runs.run.Run)
    from niah.errors import BadInput
    from niah.sweep import SweepSpec, Target, run_sweep

    with pytest.raises(BadInput, match="nothing to resume"):
        run_sweep([Target(oracle.url)], SweepSpec(lengths=[300], depths=[50.0], trials=1), missing, resume=True)
    assert not missing.exists()
    assert cli(*args, "--out", missing).exit_code == 0  # without --resume: a new run
    assert cli(*args, "--out", missing, "--resume").exit_code == 0  # and now it resumes


# -- failed replies' bodies on one line ------------------------------------------------------------
HTML = ("<!DOCTYPE html>\n<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n"
        + "<p>upstream\tdown</p>\n" * 400 + "</body></html>\n")


class _HtmlErrors(BaseHTTPRequestHandler):
    def _html(self, status):
        data = HTML.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._html(500)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._html(400)

    def log_message(self, *a):
        pass


@pytest.fixture
def html_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _HtmlErrors)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_an_http_error_body_is_cut_to_one_bounded_line(html_server):
    from niah.client import BODY_CHARS, RequestConfig, complete, make_client

    async def one(stream: bool):
        cfg = RequestConfig(endpoint=html_server, model="m", stream=stream, retries=0)
        async with make_client(cfg) as client:
            return await complete(client, cfg, {"messages": [{"role": "user", "content": "hi"}]})

    for stream in (True, False):
        err = asyncio.run(one(stream)).error
        assert err.startswith("HTTP 400: <!DOCTYPE html> <html> <head><title>502 Bad Gateway"), err
        assert "\n" not in err and "\t" not in err and len(err) < BODY_CHARS + 60, err
    # the probe of /v1/models before a sweep: one line too
    line = one_line_2(cli("sweep", "--endpoint", html_server, "--lengths", "300", "--depths", "50", "-q"))
    assert "answered HTTP 500" in line and len(line) < BODY_CHARS + 150, line


# -- progress without a terminal -----------------------------------------------------------------
def test_without_a_terminal_progress_is_plain_lines_at_most_one_per_interval(oracle, tmp_path):
    from rich.console import Console

    from niah.sweep import SweepSpec, Target, run_sweep
    from niah.sweep.progress import SweepProgress

    spec = SweepSpec(lengths=[300, 400], depths=[0.0, 100.0], trials=1)
    buf = io.StringIO()
    console = Console(file=buf, width=100)
    assert not console.is_terminal
    run_sweep([Target(oracle.url)], spec, tmp_path / "every", progress=SweepProgress(console, interval=0))
    lines = buf.getvalue().splitlines()
    assert [ln.split(": ", 2)[2].split(",")[0] for ln in lines] == [f"{i}/4 trials" for i in range(1, 5)], lines
    assert all(ln.startswith("niah: default: ") and "recall 100% (" in ln and "ETA " in ln for ln in lines)
    assert lines[-1].endswith("ETA 0:00:00")
    buf = io.StringIO()
    run_sweep([Target(oracle.url)], spec, tmp_path / "rare",
              progress=SweepProgress(Console(file=buf, width=100), interval=3600))
    assert buf.getvalue() == ""  # not one line before an interval has passed


# -- niah serve without the [serve] extra ------------------------------------------------------
BLOCK = """
import importlib.abc, sys
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {mod!r}:
            raise {exc}(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Missing())
sys.argv = ["niah", "serve", "--port", "0"]
from niah.cli import main
main()
"""


@pytest.mark.parametrize("mod, exc", [("fastapi", "ModuleNotFoundError"), ("uvicorn", "ImportError"),
                                      ("torch", "ModuleNotFoundError")])
def test_serve_without_its_extra_is_one_line_exit_2(mod, exc):
    r = subprocess.run([sys.executable, "-c", BLOCK.format(mod=mod, exc=exc)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [r.stderr.strip()] and "Traceback" not in r.stderr, r.stderr
    assert f"niah serve needs the [serve] extra: {mod} cannot be imported" in r.stderr
    assert "pip install 'niah-lab[serve]' (in a checkout: pip install -e '.[serve]')" in r.stderr


# -- the server from the environment; --header / --extra-body refused when malformed ----------------
def _inproc(*args, env=None, drop=("NIAH_ENDPOINT", "NIAH_MODEL", "NIAH_API_KEY", "OPENAI_BASE_URL",
                                   "OPENAI_API_KEY")):
    import os

    from cli_inproc import niah

    return niah(*args, env={**{k: v for k, v in os.environ.items() if k not in drop}, **(env or {})})


def test_endpoint_model_and_key_fall_back_to_the_environment_and_flags_win(oracle_factory, tmp_path):
    import json

    from niah.runs.trials import load_run

    key = "sk-env-fallback-51d2e7"
    srv = oracle_factory("--api-key", key)
    grid = ["--lengths", "300", "--depths", "50", "--trials", "1", "-q"]
    # NIAH_ENDPOINT and NIAH_MODEL, the key from OPENAI_API_KEY (an empty NIAH_API_KEY is unset)
    r = _inproc("sweep", *grid, "--out", tmp_path / "a",
                env={"NIAH_ENDPOINT": srv.url, "NIAH_MODEL": "oracle-1", "NIAH_API_KEY": "", "OPENAI_API_KEY": key})
    assert r.returncode == 0, r.stderr
    manifest, recs = load_run(tmp_path / "a")
    assert manifest["configs"]["default"]["endpoint"] == srv.url and recs[0]["outcome"] == "correct"
    # OPENAI_BASE_URL when NIAH_ENDPOINT is empty (a CI secret a fork does not get)
    r = _inproc("sweep", *grid, "--out", tmp_path / "b",
                env={"NIAH_ENDPOINT": "", "OPENAI_BASE_URL": srv.url, "OPENAI_API_KEY": key})
    assert r.returncode == 0 and load_run(tmp_path / "b")[1][0]["outcome"] == "correct", r.stderr
    # flags win over every variable
    r = _inproc("sweep", *grid, "--out", tmp_path / "c", "--endpoint", srv.url, "--model", "oracle-1",
                "--api-key", key, env={"NIAH_ENDPOINT": "http://127.0.0.1:9/v1", "NIAH_MODEL": "nope",
                                       "NIAH_API_KEY": "wrong-key-123456"})
    assert r.returncode == 0, r.stderr
    # the variable is read: a model the server lacks is named
    r = _inproc("sweep", *grid, "--out", tmp_path / "d", env={"NIAH_ENDPOINT": srv.url, "NIAH_MODEL": "nope",
                                                              "NIAH_API_KEY": key})
    assert r.returncode == 2 and "model 'nope' is not served" in r.stderr
    for run in ("a", "b", "c"):
        assert key not in json.dumps(load_run(tmp_path / run)[0])
        assert [p for p in (tmp_path / run).rglob("*") if p.is_file() and key.encode() in p.read_bytes()] == []


def test_prompt_and_prompts_build_take_the_same_server_options(oracle_factory, tmp_path):
    """The one declaration of --endpoint / --model / --api-key (niah.commands.options
    server_options) on `niah prompt` and `niah prompts build`: the variables are read, the
    flags win, and the key is never written."""
    key = "sk-env-prompts-7c41a9"
    srv = oracle_factory("--api-key", key)
    env = {"NIAH_ENDPOINT": srv.url, "NIAH_MODEL": "oracle-1", "OPENAI_API_KEY": key}
    wrong = {"NIAH_ENDPOINT": "http://127.0.0.1:9/v1", "NIAH_MODEL": "nope", "NIAH_API_KEY": "wrong-key-123456"}
    flags = ["--endpoint", srv.url, "--model", "oracle-1", "--api-key", key]
    for cmd in (["prompt", "--length", "300", "--json"],
                ["prompts", "build", "--lengths", "300", "--depths", "50", "--trials", "1", "--out", tmp_path / "s"]):
        r = _inproc(*cmd, env=env)
        assert r.returncode == 0, (cmd, r.stderr)
        assert _inproc(*cmd, *flags, env=wrong).returncode == 0, cmd
        r = _inproc(*cmd, env={**env, "NIAH_MODEL": "nope"})
        assert r.returncode == 2 and "model 'nope' is not served" in r.stderr, (cmd, r.stderr)
    assert key.encode() not in (tmp_path / "s").read_bytes()


@pytest.mark.parametrize("args, words", [
    (["--extra-body", "{not json"], "--extra-body is not JSON"),
    (["--extra-body", "[1, 2]"], "must be a JSON object"),
    (["--extra-body", '{"max_tokens": 5}'], "cannot set max_tokens"),
    (["--header", "no-colon"], "is not NAME:VALUE"),
    (["--header", "bad name: x"], "is not NAME:VALUE"),
])
def test_bad_extra_body_or_header_is_one_line_exit_2(args, words, tmp_path):
    r = _inproc("sweep", "--endpoint", "http://127.0.0.1:9/v1", "--out", tmp_path / "r", "-q", *args)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("niah: error: ") and words in r.stderr, r.stderr
    assert not (tmp_path / "r").exists()  # refused before anything ran


@pytest.mark.parametrize("args, words", [
    (["--endpoint", "http://[::1"], "is not a URL"),
    (["--endpoint", "http:///v1"], "names no host"),
    (["--endpoint", "http://127.0.0.1:9/v1", "--header", "X-Team: é"], "must be ASCII"),
    (["--endpoint", "http://127.0.0.1:9/v1", "--api-key", "clé secrète"], "must be ASCII without spaces"),
])
def test_malformed_endpoint_header_or_key_is_one_line_before_any_request(tmp_path, args, words):
    line = one_line_2(cli("sweep", *args, "--lengths", "1k", "--out", tmp_path / "run"))
    assert words in line and not (tmp_path / "run").exists()


def test_export_refuses_a_folder_with_corrupt_trials(run, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    with open(bad / "trials.jsonl", "a", encoding="utf-8") as f:
        f.write("not json\n" + (bad / "trials.jsonl").read_text(encoding="utf-8").splitlines()[0] + "\n")
    assert "cannot be trusted" in one_line_2(cli("export", bad, "-f", "json"))
    assert not (bad / "trials.json").exists()
