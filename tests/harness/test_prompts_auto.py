"""`niah prompts build --lengths auto` does what its help says: k/2, k, 2k, 4k, ... of the
server's index_topk (GET /v1/models), up to the model's context, as `niah sweep` does."""

from __future__ import annotations

from cli_inproc import niah

from niah.prompts.sets import read_set
from niah.sweep.indexer import auto_lengths


def test_prompts_build_lengths_auto_reads_the_servers_k_and_context(oracle_factory, tmp_path):
    server = oracle_factory("--index-topk", "256", "--max-model-len", "2048")
    out = tmp_path / "set.jsonl"
    r = niah("prompts", "build", "--endpoint", server.url, "--lengths", "auto", "--depths", "50", "--trials", "1",
             "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    want = auto_lengths([256], 2048, 32)
    assert want == [128, 256, 512, 1024]  # 2048 does not fit beside 32 answer tokens
    assert sorted({e.length for e in read_set(out)}) == want
    assert f"--lengths auto: {', '.join(map(str, want))}" in r.stderr


def test_prompts_build_lengths_auto_without_a_k_is_one_line_of_bad_input(oracle_factory, tmp_path):
    server = oracle_factory()
    r = niah("prompts", "build", "--endpoint", server.url, "--lengths", "auto", "--out", tmp_path / "s.jsonl")
    assert r.returncode == 2 and "needs an index_topk" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "s.jsonl").exists()
