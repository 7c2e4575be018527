"""Planted faults (`niah serve --fault NAME[:PARAM]`): each changes only what it claims.

In-process on real weights (paths_helpers: every selection of a request, row by row),
against the same path without the fault, fp8 index keys at top-k 16, ~150-token prompts:
- layout:N — rows whose chunk sees <= N keys select as without it; some row past N does not;
- residue:R (4:1 compression) — a prompt of length R mod 4 selects otherwise; one token
  shorter (another residue), every row and the answer are the same;
- topk:K — every row keeps K keys, the plain top-k's K best in layer 0 (same inputs); a
  prompt within index_topk answers the same;
- rope-base:B — only the index keys move (the KV cache is the same), by a rotation 0 at
  position 0 that grows with the position;
- decode-page — the prefill's rows are the plain path's; a decode step's are not;
- prefix-stale — a cold request is the plain one; on a hit the KV rows are the cold
  request's and the index keys are not;
- page-move — a cold request is the plain one; on a hit the KV rows are not the cold ones.
Then through a real server: the faults and the paths attested, a label that says otherwise
INVALID, and `niah gate` refusing the faulted server as a baseline; bad flags are one line.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from paths_helpers import build, differing, generate, ids_of, prompt  # noqa: E402 - after the skips

pytestmark = pytest.mark.slow
SECRETS = ("4817263", "9035521")


@pytest.fixture(scope="module")
def plain(path_weights, path_tok):
    m = build(path_weights)
    return generate(m, path_tok, prompt(SECRETS[0]))


def test_layout_fault_changes_only_rows_past_its_length(path_weights, path_tok, plain):
    got = generate(build(path_weights, faults=("layout:100",)), path_tok, prompt(SECRETS[0]))
    bad = differing(got.selections, plain.selections)
    assert bad and all(pos >= 96 for _, pos in bad)               # query chunks of 32: [96, 128) is the first past 100
    assert all(got.selections[k] == plain.selections[k] for k in plain.selections if k[1] < 96)


def test_residue_fault_changes_only_its_residue(path_weights, path_tok):
    ids = ids_of(path_tok, prompt(SECRETS[0], before=6))
    ids = ids[:len(ids) - (len(ids) - 3) % 4]                     # length 3 mod 4
    cfg = dict(index_topk=8, index_compress=4, window=8)
    clean, faulty = build(path_weights, **cfg), build(path_weights, **cfg, faults=("residue:3",))
    assert len(ids) % 4 == 3
    assert differing(generate(faulty, path_tok, ids).selections, generate(clean, path_tok, ids).selections)
    other = ids[:-1]                                              # 2 mod 4
    a, b = generate(clean, path_tok, other), generate(faulty, path_tok, other)
    assert a.text == b.text and a.selections == b.selections


def test_topk_fault_keeps_fewer_keys_and_only_past_index_topk(path_weights, path_tok, plain):
    m = build(path_weights, faults=("topk:8",))
    got = generate(m, path_tok, prompt(SECRETS[0]))
    assert all(len(kept) == 8 for (_, pos), kept in got.selections.items() if pos >= 8)
    assert all(set(got.selections[(0, pos)]) <= set(plain.selections[(0, pos)]) for _, pos in got.selections
               if pos >= 16)                                      # layer 0: the same scores, the 8 best of 16
    short = ids_of(path_tok, prompt(SECRETS[0]))[:13]                # 13 + 3 tokens <= index_topk: dense throughout
    assert generate(m, path_tok, short).text == generate(build(path_weights), path_tok, short).text


def test_rope_base_fault_moves_only_the_index_keys_and_more_with_position(path_weights, path_tok, plain):
    from niah.serving.embedded.dsa import DSA
    from niah.serving.embedded.faults import Faults
    from niah.serving.embedded.model import LayerCache

    k = torch.randn(1, 3, 200, 64)
    caches = []
    for f in (None, Faults(rope_base=10000.0)):
        cache = LayerCache(k=k.clone(), v=torch.zeros(1, 3, 200, 64), idx_k=torch.zeros(3, 200, 64))
        DSA("fp32", 16, faults=f).store(cache, k, 0)
        caches.append(cache)
    diff = (caches[0].idx_k - caches[1].idx_k).norm(dim=(0, 2))   # [200]
    assert float(diff[0]) == 0 and 3 * float(diff[1:4].mean()) < float(diff[100:].mean())   # grows, 0 at position 0
    assert torch.equal(caches[0].k, caches[1].k)                  # the KV cache is untouched
    got = generate(build(path_weights, faults=("rope-base:10000",)), path_tok, prompt(SECRETS[0]))
    assert differing(got.selections, plain.selections)


def test_decode_page_fault_changes_decode_rows_only(path_weights, path_tok, plain):
    got = generate(build(path_weights, page_size=16, faults=("decode-page",)), path_tok, prompt(SECRETS[0]))
    n = len(ids_of(path_tok, prompt(SECRETS[0])))
    bad = differing(got.selections, plain.selections)
    assert bad and all(pos >= n for _, pos in bad)                # decode steps only
    assert all(got.selections[k] == plain.selections[k] for k in plain.selections if k[1] < n)


@pytest.fixture(scope="module")
def cold_second(path_weights, path_tok):
    """The second prompt, cold, and its layer-0 KV and index keys."""
    m = build(path_weights, page_size=16)
    run = generate(m, path_tok, prompt(SECRETS[1]))
    c = m.caches[0]
    return run, c.k.clone(), m.attention_impl.keys.read(c, 0, 128).clone()


@pytest.mark.parametrize("fault", ["prefix-stale", "page-move"])
def test_prefix_faults_change_only_a_hit(path_weights, path_tok, plain, cold_second, fault):
    cold, cold_k, cold_idx = cold_second
    m = build(path_weights, page_size=16, prefix_cache=True, faults=(fault,))
    first = generate(m, path_tok, prompt(SECRETS[0]))
    assert first.prefix_hit == 0 and first.selections == plain.selections and first.text == plain.text
    second = generate(m, path_tok, prompt(SECRETS[1]))
    hit = second.prefix_hit
    assert hit >= 64
    c = m.caches[0]
    kv_same = torch.equal(c.k[:, :, :hit], cold_k[:, :, :hit])
    idx_same = torch.equal(m.attention_impl.keys.read(c, 0, hit), cold_idx[:, :hit])
    assert (kv_same, idx_same) == ((True, False) if fault == "prefix-stale" else (False, False))
    assert differing(second.selections, cold.selections)


@pytest.mark.parametrize("args, line", [
    (["--fault", "bogus"], "unknown fault 'bogus'"),
    (["--fault", "residue:3"], "use --index-compress 4"),
    (["--fault", "decode-page"], "use --page-size"),
    (["--fault", "prefix-stale", "--page-size", "16"], "use --prefix-cache"),
    (["--fault", "topk:x"], "the parameter must be a number"),
    (["--fault", "layout", "--attention", "dense"], "use it with --attention dsa"),
    (["--prefix-cache"], "give it a --page-size"),
    (["--index-compress", "2"], "must be 1 (off) or 4"),
    (["--index-compress", "4", "--page-size", "6"], "must be a multiple of 4"),
    (["--max-model-len", "9000"], "--max-model-len must be 64..8,192 (the model's context), not 9000"),
    (["--topk", "fused"], "use them with --device cuda"),
    (["--device", "cuda", "--topk", "fused", "--index-dtype", "fp32"], "--topk fused scores fp8 or bf16 pages"),
    (["--device", "cuda", "--topk", "fused", "--index-dtype", "bf16", "--bf16-read", "gather"],
     "--topk fused scores fp8 or bf16 pages"),
])
def test_bad_fault_and_path_flags_are_one_line_exit_2(args, line):
    from cli_inproc import niah

    r = niah("serve", *args, "--port", "0")
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip()
    assert line in err and len(err.splitlines()) == 1 and "Traceback" not in err


FLAGS = ("--attention", "dsa", "--index-topk", "16", "--page-size", "16", "--prefill-chunk", "64", "--prefix-cache",
         "--fault", "topk:8", "--fault", "prefix-stale")


def test_server_attests_paths_and_faults_and_the_gate_refuses_it_as_a_baseline(embedded_server):
    import httpx

    from niah.attestation import INVALID, VALID, check_baseline, status
    from niah.attestation.readings import read_server
    from niah.errors import BadInput

    s = embedded_server(*FLAGS)
    start = read_server(s.url)
    for secret in SECRETS:                                        # the second hits the first one's pages
        r = httpx.post(s.url + "/completions", json={"prompt": prompt(secret), "max_tokens": 2}, timeout=120)
        assert r.status_code == 200, r.text
    end = read_server(s.url)
    facts = end["attestation"]["facts"]
    assert facts["faults"] == ["prefix-stale", "topk:8"]          # canonical order
    assert (facts["page_size"], facts["prefill_chunk"], facts["prefix_cache"], facts["index_compress"]) == (
        16, 64, True, 1)
    info = httpx.get(s.base + "/server_info").json()
    assert info["prefix_cache"]["hits"] == 1 and info["prefix_cache"]["tokens_reused"] >= 64
    assert info["faults"] == ["topk:8", "prefix-stale"]           # as given, in describe()

    def entry(**labels):
        return {"engine": "embedded", "settings": labels,
                "attestation": {"segments": [{"start": start, "end": end}]}}

    assert status(entry(page_size=16, prefill_chunk=64, prefix_cache=True))[0] == VALID
    for wrong in ({"page_size": 32}, {"prefill_chunk": 512}, {"prefix_cache": False}, {"index_compress": 4}):
        state, reason = status(entry(**wrong))
        assert state == INVALID and f"labelled {next(iter(wrong))}" in reason
    with pytest.raises(BadInput, match=r"planted faults \(prefix-stale, topk:8\)"):
        check_baseline({"configs": {"arm": entry()}}, ["arm"], "baseline")
