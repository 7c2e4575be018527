"""Nothing a sweep, a resume or a rescore does loses a user's files: a folder that is not a niah
run's is refused before one byte is written; a line in the middle of trials.jsonl that is not a
record is refused by `--resume` and `rescore` naming file:line (never rewritten away); only a
last line cut short by a kill (no newline at its end) counts as a write cut short.

Through the real command line (tests/cli_inproc.py) against the loopback oracle server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_inproc import niah

GRID = ["--lengths", "400", "--depths", "0,100", "--trials", "2", "-q"]


def _snapshot(folder: Path, lock: bool = True) -> dict[str, bytes]:
    """Every file's bytes (`lock=False`: but the lock file, which names its latest holder)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and (lock or p.name != ".niah.lock")}


def _one_line_2(r, *words) -> str:
    assert r.returncode == 2, r.stdout + r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("niah: error:"), r.stderr
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in err[0], err[0]
    return err[0]


@pytest.mark.parametrize("files", [
    {"manifest.json": '{"name": "my-project", "version": "1.0.0"}\n', "README.md": "mine\n"},
    {"prompts.jsonl": '{"id": 1, "text": "my own prompts"}\n'},
    {"manifest.json": "not json at all\n", "trials.jsonl": "my lab notes\n"},
], ids=["project-manifest", "own-prompts", "unreadable-manifest"])
@pytest.mark.parametrize("resume", [False, True], ids=["fresh", "resume"])
def test_a_folder_that_is_not_a_niah_run_is_refused_and_left_as_it_was(oracle, tmp_path, files, resume):
    folder = tmp_path / "project"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    before = _snapshot(folder)
    r = niah("sweep", "--endpoint", oracle.url, *GRID, "--out", folder, *(["--resume"] if resume else []))
    _one_line_2(r, str(folder), "not a niah run folder")
    assert _snapshot(folder) == before  # every byte, and no file added (no lock, no manifest)


def _swept(oracle, run: Path) -> list[str]:
    r = niah("sweep", "--endpoint", oracle.url, *GRID, "--out", run)
    assert r.returncode == 0, r.stderr
    return (run / "trials.jsonl").read_text().splitlines()


def test_a_corrupt_line_in_the_middle_is_refused_by_resume_and_rescore_naming_its_line(oracle, tmp_path):
    run = tmp_path / "run"
    lines = _swept(oracle, run)
    assert len(lines) == 4
    # line 2 damaged (a disk error, a hand edit): its trial must not vanish on the next resume
    broken = [lines[0], lines[1][:60], *lines[2:]]
    (run / "trials.jsonl").write_text("".join(line + "\n" for line in broken))
    before = _snapshot(run, lock=False)
    r = niah("sweep", "--endpoint", oracle.url, *GRID, "--out", run, "--resume")
    _one_line_2(r, f"{run / 'trials.jsonl'}:2", "not a JSON trial record")
    assert _snapshot(run, lock=False) == before
    r = niah("rescore", run)
    _one_line_2(r, f"{run / 'trials.jsonl'}:2", "not a JSON trial record")
    assert _snapshot(run, lock=False) == before


def test_a_complete_last_line_that_is_not_a_record_is_no_write_cut_short(oracle, tmp_path):
    """A kill mid-write leaves the last line without its newline (the writer's last byte); a
    last line that ends in a newline and does not parse was written whole, and is refused."""
    run = tmp_path / "run"
    lines = _swept(oracle, run)
    (run / "trials.jsonl").write_text("".join(line + "\n" for line in [*lines[:-1], "garbage"]))
    before = _snapshot(run, lock=False)
    r = niah("sweep", "--endpoint", oracle.url, *GRID, "--out", run, "--resume")
    _one_line_2(r, f"{run / 'trials.jsonl'}:4")
    assert _snapshot(run, lock=False) == before


def test_a_last_line_cut_short_by_a_kill_is_run_again_by_resume(oracle, tmp_path):
    run = tmp_path / "run"
    lines = _swept(oracle, run)
    (run / "trials.jsonl").write_text("".join(line + "\n" for line in lines[:-1]) + lines[-1][:50])
    r = niah("sweep", "--endpoint", oracle.url, *GRID, "--out", run, "--resume")
    assert r.returncode == 0, r.stderr
    assert "skipped unreadable line(s) [4] (a write cut short)" in r.stderr
    recs = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    assert sorted((x["depth"], x["trial"]) for x in recs) == [(0.0, 0), (0.0, 1), (100.0, 0), (100.0, 1)]
