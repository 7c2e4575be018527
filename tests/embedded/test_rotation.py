"""The index rotation (`index_rotation = "none" | "hadamard"`): DeepSeek's normalised
Hadamard transform of the head dimension applied to the index query and keys before the
key store quantises, in the embedded server, the matrix, the manifest and the attestation.

- the matrix is SGLang's own (lifted from the 0.5.23 wheel), orthonormal, and keeps q.k
  of the real model's post-RoPE queries and keys to fp32 precision;
- rotated fp8 keys differ from unrotated fp8 keys where channels have outliers, and
  change the selection;
- the fidelity probe's exact reference is the same for every arm (fp32 + rotation scores
  ~1.0 against it; the reference itself is bitwise identical across arms);
- bad values are refused (DSA, `niah serve` with one line and exit 2, the matrix naming
  the line); a real embedded server reports the rotation in /v1/models, /server_info,
  the manifest and its attestation, and a label that contradicts the server's rotation
  makes the configuration invalid.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sglang_source import load_function, sglang_wheel  # noqa: E402

from niah.errors import BadInput  # noqa: E402

TEXT = ("The lighthouse keeper wrote every evening about the weather, the ships and the gulls. "
        "On Tuesday the fog came in early and the bell rang for hours. The secret number is 4817263. "
        "Nobody on the island remembered a colder spring, and the harbour froze twice. ")


# -- the transform ----------------------------------------------------------------------------
def test_hadamard_is_sglangs_matrix_normalised():
    from niah.kernels.rotation import hadamard

    import functools

    ns = {"torch": torch, "lru_cache": functools.lru_cache}
    sglang_h128 = load_function(sglang_wheel(), "sglang.srt.layers.attention.dsa.dsa_npu_indexer",
                                "_create_hadamard_128_cpu", ns)()            # [128, 128] bf16 of +-1
    assert torch.equal((hadamard(128) * 128 ** 0.5).round(), sglang_h128.float())
    for d in (1, 2, 64, 128):
        h = hadamard(d)
        assert h.shape == (d, d) and h.dtype == torch.float32 and torch.equal(h, h.T)
        assert (h @ h.T - torch.eye(d)).abs().max().item() <= 1e-6       # orthonormal
    for bad in (0, 3, 96):
        with pytest.raises(ValueError, match="power-of-2"):
            hadamard(bad)


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    from niah.serving.embedded import weights
    from niah.serving.embedded.model import Transformer

    torch.set_num_threads(2)
    loaded = weights.load()
    m = Transformer.from_loaded(loaded)
    m.ids = loaded.tokenizer.encode(TEXT * 4, add_special_tokens=False).ids      # ~170 tokens
    return m


@pytest.fixture(scope="module")
def captured(model):
    """Each layer's post-RoPE q [1, H, T, D] and k [Hkv, T, D] of the real model."""
    from niah.serving.embedded.model import dense_attention

    class Capture:
        name = "capture"

        def __init__(self):
            self.q, self.k = {}, {}

        def store(self, cache, k, start):
            pass

        def __call__(self, q, cache, start):
            S = start + q.shape[2]
            self.q[cache.layer_id], self.k[cache.layer_id] = q.clone(), cache.k[0, :, :S].clone()
            return dense_attention(q, cache, start)

    cap = Capture()
    model.set_attention(cap)
    model(torch.tensor([model.ids]), 0)
    return cap


@pytest.mark.slow
def test_rotation_keeps_q_dot_k_of_the_real_model(captured):
    from niah.kernels.rotation import rotate

    for layer in (0, 11, 29):
        q, k = captured.q[layer][0], captured.k[layer]                          # [H, T, D], [Hkv, T, D]
        G = q.shape[0] // k.shape[0]
        exact = torch.einsum("htd,hsd->hts", q.double(), k.double().repeat_interleave(G, 0))
        rot = torch.einsum("htd,hsd->hts", rotate(q, "hadamard"), rotate(k, "hadamard").repeat_interleave(G, 0))
        plain = torch.einsum("htd,hsd->hts", q, k.repeat_interleave(G, 0))
        scale = exact.abs().amax().item()
        assert (rot.double() - exact).abs().max().item() <= 1e-5 * scale                  # fp32 precision
        assert (rot.double() - exact).abs().max().item() <= 8 * (plain.double() - exact).abs().max().item()
        assert not torch.equal(rotate(k, "hadamard"), k)                          # it did rotate
    assert torch.equal(rotate(captured.k[0], "none"), captured.k[0])


@pytest.mark.slow
def test_rotated_fp8_differs_where_channels_have_outliers(captured):
    """Two outlier channels (x20, as RoPE'd keys have): fp8 of the rotated key, rotated back,
    is another approximation than fp8 of the key itself, both within fp8's error, and the
    top-k they give differ. Without outliers the two round trips lose the same amount."""
    from niah.kernels.quant import store_roundtrip
    from niah.kernels.rotation import hadamard, rotate
    from niah.serving.embedded.dsa import DSA

    g = torch.Generator().manual_seed(0)
    k = torch.randn(3, 1024, 64, generator=g)
    k[:, :, [3, 40]] *= 20
    q = torch.randn(1, 9, 16, 64, generator=g)
    plain = store_roundtrip(k, "fp8")
    rotated = store_roundtrip(rotate(k, "hadamard"), "fp8") @ hadamard(64).T          # back to k's basis
    amax = k.abs().amax(-1, keepdim=True)
    for approx in (plain, rotated):
        assert ((approx - k).abs() <= amax / 16).all()                            # e4m3: 3 mantissa bits
    assert (rotated - plain).abs().amax().item() > 1e-2
    # the error moves: unrotated it sits in proportion to each channel, rotated it spreads
    err_plain, err_rot = (plain - k).abs(), (rotated - k).abs()
    assert err_plain[..., [3, 40]].mean() > 5 * err_plain[..., :3].mean()
    assert err_rot[..., [3, 40]].mean() < 2 * err_rot[..., :3].mean()
    sel = {rot: DSA("fp8", topk=64, rotation=rot).select(rotate(q, rot), store_roundtrip(rotate(k, rot), "fp8"), 1008)
           for rot in ("none", "hadamard")}
    assert (sel["none"] != sel["hadamard"]).any()
    # the real model's keys: rotation changes what fp8 keeps somewhere
    layer = 5
    qm, km = captured.q[layer], captured.k[layer]
    pick = {rot: DSA("fp8", topk=24, rotation=rot).select(rotate(qm, rot), store_roundtrip(rotate(km, rot), "fp8"), 0)
            for rot in ("none", "hadamard")}
    assert (pick["none"] != pick["hadamard"]).any()


# -- the DSA emulation and its probe ---------------------------------------------------------------
def _probe_fidelity(model, att) -> list[float]:
    """Per layer: the fidelity the probe reports for the last prompt token."""
    from niah.serving.embedded.generate import prefill
    from niah.serving.embedded.probe import ProbeLog

    model.set_attention(att)
    T = len(model.ids)
    probe = ProbeLog((T - 20, T - 10), model.args.n_layer, att.topk)
    prefill(model, model.ids, None, probe)
    probe.next_step()
    return probe.steps[0]["fidelity"]


@pytest.mark.slow
def test_probe_reference_is_the_same_exact_keys_for_every_arm(model, captured):
    from niah.serving.embedded.dsa import DSA
    from niah.serving.embedded.model import LayerCache

    q, k = captured.q[7], captured.k[7]
    S = k.shape[1]
    cache = LayerCache(k=k[None].clone(), v=torch.zeros_like(k[None]))
    refs = [DSA(d, topk=24, rotation=r).exact_scores(q[:, :, -1:], cache, S)
            for d in ("fp8", "bf16", "fp32") for r in ("none", "hadamard")]
    assert all(torch.equal(refs[0], x) for x in refs[1:])
    # through the model's probe: rotated fp32 keys select the exact top-k (up to fp32 near-ties)
    exact_rot = _probe_fidelity(model, DSA("fp32", topk=24, rotation="hadamard"))
    model.set_attention(None)
    assert min(exact_rot) >= 0.95 and sum(exact_rot) / len(exact_rot) >= 0.99


def test_rotation_is_stored_and_attested():
    from niah.kernels.quant import store_roundtrip
    from niah.kernels.rotation import rotate
    from niah.serving.embedded.dsa import DSA, attestation
    from niah.serving.embedded.model import LayerCache
    from niah.serving.sglang import attest

    attest.reset()
    try:
        k = torch.randn(1, 3, 8, 64)
        for rot in ("hadamard", "none"):
            dsa = DSA("fp8", topk=4, rotation=rot)
            cache = LayerCache(k=torch.zeros(1, 3, 16, 64), v=torch.zeros(1, 3, 16, 64), idx_k=torch.zeros(3, 16, 64))
            dsa.store(cache, k, 0)
            assert torch.equal(cache.idx_k[:, :8], store_roundtrip(rotate(k[0], rot), "fp8"))
            assert attestation()["facts"]["rotation"] == rot
            assert dsa.describe()["index_rotation"] == rot
    finally:
        attest.reset()
    with pytest.raises(ValueError, match="index rotation"):
        DSA("fp8", rotation="givens")


# -- refusals ----------------------------------------------------------------------------------------
def test_bad_rotation_is_refused_with_one_line():
    from niah.errors import BadInput
    from niah.serving.matrix import parse_matrix

    from cli_inproc import niah  # the entry point in this process (tests/cli_inproc.py)

    r = niah("serve", "--index-rotation", "givens", "--port", "0")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == ["niah: error: --index-rotation must be none or hadamard, not 'givens'"]
    with pytest.raises(BadInput, match=r"m.toml:3: index_rotation must be one of 'none', 'hadamard', not 'qr'"):
        parse_matrix('engine = "embedded"\n[[config]]\nindex_rotation = "qr"\nname = "a"\n', "m.toml")
    with pytest.raises(BadInput, match=r"m.toml:3: axis 'index_rotation': must be one of"):
        parse_matrix('engine = "embedded"\n[axes]\nindex_rotation = ["none", "qr"]\n', "m.toml")
    with pytest.raises(BadInput, match=r"args may not set --index-rotation"):
        parse_matrix('engine = "embedded"\n[[config]]\nname = "a"\nargs = ["--index-rotation", "hadamard"]\n', "m.toml")


# -- the matrix, the manifest, the report pairing --------------------------------------------------------
def test_matrix_names_the_axis_and_changes_one_flag():
    from niah.serving.matrix import axis_differences, parse_matrix

    m = parse_matrix('engine = "embedded"\nattention = "dsa"\n[axes]\nindex_dtype = ["fp8"]\n'
                     'index_rotation = ["none", "hadamard"]\nindex_topk = [64]\n', "m.toml")
    assert m.names() == ["fp8-norot-k64", "fp8-hadamard-k64"]
    (d,) = axis_differences(m)
    assert (d["axis"], d["argv"], d["env"]) == (
        "index_rotation", ["--index-rotation none -> --index-rotation hadamard"], {})
    # a [[config]] that rotates pairs with the [axes] arm that does not (the default "none")
    m = parse_matrix('engine = "embedded"\n[axes]\nindex_dtype = ["fp8"]\nindex_topk = [64]\n'
                     '[[config]]\nname = "rot"\nindex_dtype = "fp8"\nindex_topk = 64\nindex_rotation = "hadamard"\n',
                     "m.toml")
    (d,) = axis_differences(m)
    assert (d["axis"], d["a"], d["b"]) == ("index_rotation", "fp8-k64", "rot")
    assert d["argv"] == ["+ --index-rotation hadamard"]


def test_report_pairs_rotation_and_shows_the_same_k_table(tmp_path, capsys):
    from report_runs import make_run

    from niah.sweep.indexer import config_topk
    from niah.report import indexer_pairs
    from niah.report.data import config_infos, load_frame, one_axis_pairs
    from niah.report.render import render_report

    arms = {"fp8-k64": {"index_dtype": "fp8", "index_topk": 64},
            "bf16-k64": {"index_dtype": "bf16", "index_topk": 64},
            "fp8-hadamard-k64": {"index_dtype": "fp8", "index_topk": 64, "index_rotation": "hadamard"}}
    run = make_run(tmp_path / "r", configs=arms, lengths=(2048,), depths=(10.0, 50.0, 90.0), trials=4)
    fidelity = {"fp8-k64": 0.95, "bf16-k64": 0.99, "fp8-hadamard-k64": 0.97}
    recs = [json.loads(x) for x in (run / "trials.jsonl").read_text().splitlines()]
    for r in recs:   # fidelity per arm (+ a per-prompt wobble), the needle 1.2x deeper in fp8
        wobble = 0.001 * r["trial"] + r["depth"] / 2e4                             # mean 0.004
        r["indexer"] = {"selection_active": True, "k": 64, "fidelity": fidelity[r["config"]] + wobble,
                        "rank_worst": (1.2 if r["config"].startswith("fp8") else 1.0) * (0.3 + wobble)}
    (run / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    manifest, df = load_frame(run)
    infos = config_infos(manifest, df)
    assert ("fp8-k64", "fp8-hadamard-k64", "index_rotation: none -> hadamard @ index_dtype=fp8, index_topk=64") \
        in one_axis_pairs(infos)
    topks = {n: config_topk(manifest["configs"][n]) for n in infos}
    res = {(p.a, p.b): p for p in indexer_pairs.indexer_pairs(df, indexer_pairs.same_k_pairs(df, infos, topks))}
    assert set(res) == {("fp8-k64", "bf16-k64"), ("fp8-k64", "fp8-hadamard-k64"), ("bf16-k64", "fp8-hadamard-k64")}
    rot = res[("fp8-k64", "fp8-hadamard-k64")]
    assert (rot.fidelity.n, rot.fidelity.higher, rot.fidelity.lower) == (12, 12, 0) and rot.fidelity.p < 0.01
    assert rot.fidelity.mean_b - rot.fidelity.mean_a == pytest.approx(0.02)
    assert rot.rank.n == 12 and rot.rank.deeper == rot.rank.shallower == 0            # both fp8: same rank
    bf = res[("bf16-k64", "fp8-hadamard-k64")]
    assert bf.fidelity.lower == 12 and bf.rank.deeper == 12 and bf.rank.ratio == pytest.approx(1.2)
    assert bf.answers.losses == bf.answers.wins == 0 and bf.answers.n_a == 12
    from niah.commands.report import rank_section          # `niah compare --a fp8-k64 --b fp8-hadamard-k64`

    text = rank_section(df[df["config"] == "fp8-k64"], df[df["config"] == "fp8-hadamard-k64"], "fp8-k64",
                        "fp8-hadamard-k64", 0.05)
    assert "paired: fp8-k64 0.954, fp8-hadamard-k64 0.974; B lower in 0, higher in 12 of 12 pairs" in text
    from niah.demo import print_findings                   # what `make demo` prints: the same numbers

    print_findings(run)
    printed = capsys.readouterr().out
    assert ("top-k 64: fp8-k64 -> fp8-hadamard-k64 (12 pairs): fidelity 0.954 / 0.974 (lower in 0, higher in 12 of "
            "12;") in printed and "top-k 64: bf16-k64 -> fp8-hadamard-k64 (12 pairs)" in printed
    summary = render_report(run).summary.read_text()
    assert "## Same top-k, paired: fidelity and needle rank / k" in summary
    assert "| 64 | `fp8-k64` → `fp8-hadamard-k64` | 0.954 / 0.974 | lower in 0, higher in 12 of 12;" in summary


@pytest.mark.slow
def test_rotation_reaches_server_info_manifest_and_attestation(tmp_path):
    """A real embedded server launched by a matrix with index_rotation = "hadamard"."""
    pytest.importorskip("fastapi")
    from niah.attestation import INVALID, VALID, status
    from niah.serving.matrix import run_matrix
    from niah.runs.manifest import read_manifest
    from niah.sweep import SweepSpec

    (tmp_path / "m.toml").write_text('engine = "embedded"\nattention = "dsa"\n[[config]]\nname = "rot"\n'
                                     'index_dtype = "fp8"\nindex_topk = 64\nindex_rotation = "hadamard"\n')
    run = run_matrix(tmp_path / "m.toml", SweepSpec(lengths=[300], depths=[50.0], trials=1, max_tokens=8),
                     tmp_path / "run")
    entry = read_manifest(run)["configs"]["rot"]
    assert entry["settings"]["index_rotation"] == entry["axes"]["index_rotation"] == "hadamard"
    assert entry["server"]["server_info"]["index_rotation"] == "hadamard"
    assert entry["server"]["models"]["data"][0]["index_rotation"] == "hadamard"
    a = entry["attestation"]["segments"][-1]["end"]["attestation"]
    assert a["facts"]["rotation"] == "hadamard" and a["counts"]["prefill_logits.fp8"] > 0
    assert status(entry)[0] == VALID
    relabelled = {**entry, "settings": {**entry["settings"], "index_rotation": "none"},
                  "axes": {**entry["axes"], "index_rotation": "none"}}
    assert status(relabelled) == (INVALID, "labelled index_rotation none but the server ran hadamard")
    trial = json.loads((run / "trials.jsonl").read_text().splitlines()[0])
    assert trial["outcome"] != "error" and trial["indexer"]["selection_active"] is True


def test_label_contradicting_the_servers_rotation_is_invalid(tmp_path):
    """Loopback servers (tests/servers/tiny_server.py) that attest rotation "none": a label
    that says "none" is valid, one that says "hadamard" INVALID; a server stating no
    rotation at all cannot attest "hadamard" (INVALID) and leaves "none" unattested."""
    from lifecycle_helpers import tiny_command, toml_list

    from niah.attestation import INVALID, UNATTESTED, VALID, status
    from niah.serving.matrix import run_matrix
    from niah.runs.manifest import read_manifest
    from niah.sweep import SweepSpec

    calls = {"store": {"fp8": {"niah.store_roundtrip": {"eager": 4, "captured": 0, "replayed": 0}}}}
    att = {"index_dtype": "fp8", "kernels": "torch", "pool_bytes_per_token": 132,
           "facts": {"attention": "dsa", "rotation": "none"}, "calls": calls}
    no_fact = {**att, "facts": {"attention": "dsa"}}
    def matrix(name: str, *entries) -> Path:
        cfgs = ""
        for cfg, rot, a in entries:
            cmd = tiny_command("--attestation", json.dumps(a))
            cfgs += f'\n[[config]]\nname = "{cfg}"\nindex_rotation = "{rot}"\ncommand = {toml_list(cmd)}\n'
        (tmp_path / f"{name}.toml").write_text('engine = "command"\nindex_dtype = "fp8"\n' + cfgs)
        return tmp_path / f"{name}.toml"

    spec = SweepSpec(lengths=[200], depths=[50.0], trials=1)
    run = run_matrix(matrix("ok", ("plain", "none", att), ("silent-none", "none", no_fact)), spec, tmp_path / "run")
    configs = read_manifest(run)["configs"]
    assert status(configs["plain"])[0] == VALID
    assert status(configs["silent-none"])[0] == UNATTESTED
    # a label the server contradicts at the start is refused before any trial, naming the axis
    out = tmp_path / "claims"
    why = "labelled index_rotation hadamard but the server ran none"
    with pytest.raises(BadInput, match=why):
        run_matrix(matrix("claims", ("claims-rotation", "hadamard", att)), spec, out)
    state, reason = status(read_manifest(out)["configs"]["claims-rotation"])
    assert state == INVALID and why in reason
    assert not (out / "trials.jsonl").exists() or not (out / "trials.jsonl").read_text().strip()
    # a server that states no rotation cannot attest "hadamard"
    run = run_matrix(matrix("silent", ("silent-hadamard", "hadamard", no_fact)), spec, tmp_path / "silent")
    assert status(read_manifest(run)["configs"]["silent-hadamard"]) == (
        INVALID, "labelled index_rotation hadamard but its server attests none")
