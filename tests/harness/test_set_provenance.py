"""A run knows where its prompts came from: a sweep from `--prompts SET` records the set's
base seeds, its file's sha256 and its build parameters, and each trial the seed its prompt
was built from; a set built with another seed never pairs "by seed" with a baseline; a
`--resume` compares the set by content (the same file by another path resumes, a set rebuilt
at the same path is refused before anything changes).

Through the real command line (tests/cli_inproc.py) against the loopback oracle server."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cli_inproc import niah

GRID = ["--lengths", "400,900", "--depths", "0,100", "--trials", "2"]


def _build(oracle, out: Path, seed: int) -> Path:
    r = niah("prompts", "build", "--endpoint", oracle.url, *GRID, "--seed", seed, "--out", out)
    assert r.returncode == 0, r.stderr
    return out


def _trials(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]


def test_a_set_built_with_another_seed_is_recorded_and_never_pairs_by_seed(oracle, tmp_path):
    base = tmp_path / "base"
    r = niah("sweep", "--endpoint", oracle.url, *GRID, "--seed", "0", "--out", base, "-q")
    assert r.returncode == 0, r.stderr
    other = _build(oracle, tmp_path / "seed1.jsonl", seed=1)
    cand = tmp_path / "cand"
    r = niah("sweep", "--endpoint", oracle.url, "--prompts", other, "--out", cand, "-q")
    assert r.returncode == 0, r.stderr

    # other prompts, other seeds: compared unpaired, never as if the same needles were asked
    r = niah("gate", "--baseline", base, "--candidate", cand, "--json")
    assert r.returncode in (0, 1), r.stderr
    configs = json.loads(r.stdout)["configs"]
    assert configs and all(c["pairing"] != "seed" for c in configs.values()), configs
    assert not {t["prompt_sha256"] for t in _trials(base)} & {t["prompt_sha256"] for t in _trials(cand)}

    args = json.loads((cand / "manifest.json").read_text())["args"]
    rec = args["prompt_set"]
    assert rec["sha256"] == hashlib.sha256(other.read_bytes()).hexdigest()
    assert rec["path"] == str(other.resolve()) and rec["prompts"] == 8 and rec["base_seeds"] == [1]
    assert (rec["lengths"], rec["depths"], rec["trials"], rec["mode"]) == ([400, 900], [0.0, 100.0], 2, "chat")
    assert rec["tokenizers"] == ["server"] and rec["haystacks"] == ["prose"] and len(rec["needle_kinds"]) == 1
    assert args["seed"] == 1
    by = {(e["length"], e["depth"], e["trial"]): e["seed"]
          for e in map(json.loads, other.read_text().splitlines())}
    assert all(t["seed"] == by[(t["length"], t["depth"], t["trial"])] for t in _trials(cand))

    # the same set on both sides pairs by prompt
    again = tmp_path / "again"
    assert niah("sweep", "--endpoint", oracle.url, "--prompts", other, "--out", again, "-q").returncode == 0
    r = niah("gate", "--baseline", again, "--candidate", cand, "--json")
    assert r.returncode == 0 and {c["pairing"] for c in json.loads(r.stdout)["configs"].values()} == {"prompt"}


def _partial_run(oracle, tmp_path: Path) -> tuple[Path, list[str]]:
    """A run of set.jsonl (typed as a relative path) whose last trial is missing."""
    _build(oracle, tmp_path / "set.jsonl", seed=0)
    r = niah("sweep", "--endpoint", oracle.url, "--prompts", "set.jsonl", "--out", "run", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "run" / "trials.jsonl").read_text().splitlines()
    (tmp_path / "run" / "trials.jsonl").write_text("".join(line + "\n" for line in lines[:-1]))
    return tmp_path / "run", lines


def test_resume_takes_the_same_set_by_an_absolute_path(oracle, tmp_path):
    run, lines = _partial_run(oracle, tmp_path)
    r = niah("sweep", "--endpoint", oracle.url, "--prompts", (tmp_path / "set.jsonl").resolve(), "--out", run,
             "--resume", "-q")
    assert r.returncode == 0, r.stderr
    assert len(_trials(run)) == len(lines)


def test_resume_refuses_a_set_rebuilt_at_the_same_path(oracle, tmp_path):
    run, _ = _partial_run(oracle, tmp_path)
    _build(oracle, tmp_path / "set.jsonl", seed=1)  # the same name, other prompts
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".niah.lock"}
    r = niah("sweep", "--endpoint", oracle.url, "--prompts", "set.jsonl", "--out", "run", "--resume", "-q",
             cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "another prompt set" in err[0] and "Traceback" not in r.stderr, r.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".niah.lock"} == before
