"""DeepSeek-V4 with bf16 index keys: SGLang 0.5.23's own compressor write, indexer pool
allocation and C4 indexer read (lifted from the wheel by benchmarks/v4_lift.py) through the
plugin's replacements, on CPU tensors; the contract points; the refusals."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from niah.serving.sglang import attest, patching, plugin, v4  # noqa: E402
from niah.serving.sglang.contract import AstSource, check_contract, points_for  # noqa: E402
from sglang_source import extract_tree, sglang_wheel  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import v4_gpu_evidence as ev  # noqa: E402
import v4_lift  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
V4_MODULE = "sglang/srt/layers/attention/dsv4/indexer.py"


@pytest.fixture(scope="module")
def src():
    return v4_lift.Source(sglang_wheel())


def test_bf16_contract_lists_v4_points_and_holds():
    points = points_for("bf16")
    targets = {p.target for p in points}
    for t in ("sglang.srt.layers.attention.dsv4.compressor_v2.compress_norm_rope_store",
              "sglang.srt.layers.attention.dsv4.compressor_v2.CompressorBackendMixin.forward_indexer_compressor",
              "sglang.srt.models.deepseek_v4.MQALayer._forward_prepare",
              "sglang.srt.layers.attention.dsv4.indexer.C4IndexerBackendMixin._nonpaged_mqa_logits",
              "sglang.srt.mem_cache.deepseek_v4_memory_pool.get_dsv4_indexer_bytes_per_token"):
        assert t in targets
    assert check_contract(AstSource(sglang_wheel()), points).ok
    v4_patches = {p.target for p in plugin.patches_for("bf16", "niah") if ".dsv4." in p.target or "_v4_" in p.target}
    assert len(v4_patches) == 10 and v4_patches <= {p.target for p in points_for("bf16", "niah")}


@pytest.mark.parametrize("old,new,where", [
    ("c4_indexer_kv_cache.shape[0], 64, 1, head_dim_with_sf", "c4_indexer_kv_cache.shape[0], 64, 1, 136",
     "forward_c4_indexer"),  # the row layout the bf16 page view relies on
    ("forward_indexer_compressor = forward_unified", "forward_indexer_compressor = forward_core_compressor",
     "forward_indexer_compressor"),
])
def test_mutated_wheel_breaks_the_v4_contract(tmp_path, old, new, where):
    tree = extract_tree(sglang_wheel(), tmp_path, [p.module for p in points_for("bf16")])
    mod = "sglang/srt/layers/attention/dsv4/" + ("indexer.py" if where == "forward_c4_indexer" else "compressor_v2.py")
    text = (tree / mod).read_text()
    if old == "c4_indexer_kv_cache.shape[0], 64, 1, head_dim_with_sf":
        old, new = ("head_dim_with_sf = 68 if use_fp4_indexer else 132",
                    "head_dim_with_sf = 68 if use_fp4_indexer else 136")
    assert old in text
    (tree / mod).write_text(text.replace(old, new))
    report = check_contract(AstSource(tree), points_for("bf16"))
    assert not report.ok and any(where in p for p in report.problems), report.problems


def test_lifted_sglang_c4_indexer_selects_float64_topk_through_bf16_path(src):
    """SGLang's _forward_compress_all_in_one + forward_c4_indexer with the plugin's bf16 pool,
    store and paged read: the selection equals the float64 one, the logits are close."""
    from niah.kernels import calc_diff

    n, k = 300, 32
    inp = ev.make_inputs(n, rows=3, heads=8, seed=1, device=DEV)
    before = attest.snapshot()["counts"]
    logits, raw, pool = ev.run_arm(src, "bf16", inp, n, k, DEV)
    buf = pool.get_index_k_with_scale_buffer(0)
    assert buf.dtype == torch.bfloat16 and buf.shape[1] == 64 * 132  # 264 bytes a token
    ref = (torch.relu(torch.einsum("rhd,nd->rhn", inp["q8"].double(), ev.float64_keys(inp, n)))
           * inp["w"].double()).sum(1)
    assert calc_diff(logits.double(), ref) < 1e-4
    want = ref.topk(k, dim=1).indices.sort(1).values
    assert torch.equal(raw.sort(1).values.cpu(), want.cpu())
    after = attest.snapshot()["counts"]
    assert after.get("store.bf16", 0) == before.get("store.bf16", 0) + 1
    assert after.get("decode_logits.bf16", 0) == before.get("decode_logits.bf16", 0) + 1
    assert after.get("decode_logits.fp8", 0) == before.get("decode_logits.fp8", 0)


def test_bf16_rows_are_the_fp8_keys_before_their_final_cast(src):
    """Same inputs, both arms: bf16 rows vs the fp8 rows' dequantised values agree to fp8 precision."""
    n = 70
    inp = ev.make_inputs(n, rows=1, heads=4, seed=2, device=DEV)
    _, _, p16 = ev.run_arm(src, "bf16", inp, n, 8, DEV)
    _, _, p8 = ev.run_arm(src, "fp8", inp, n, 8, DEV)
    slot = ev.slots(inp, n)
    b16 = p16.get_index_k_with_scale_buffer(0).view(-1, 64 * 132)
    rows16 = torch.stack([b16[s // 64, (s % 64) * 128:(s % 64) * 128 + 128] for s in slot.tolist()]).float()
    b8 = p8.get_index_k_with_scale_buffer(0)
    vals = torch.stack([b8[s // 64, (s % 64) * 128:(s % 64) * 128 + 128] for s in slot.tolist()])
    scales = torch.stack([b8[s // 64, 128 * 64 + (s % 64) * 4:128 * 64 + (s % 64) * 4 + 4] for s in slot.tolist()])
    deq = vals.view(torch.float8_e4m3fn).float() * scales.contiguous().view(torch.float32)
    err = (deq - rows16).abs().amax(1) / rows16.abs().amax(1)
    assert float(err.max()) < 2**-4 and float(err.max()) > 0


def test_pool_sizing_is_twice_the_fp8_row_and_fp4_pools_are_refused(src):
    ns = v4_lift.base_ns()
    orig = v4_lift.lift(src, v4_lift.POOL, "get_dsv4_indexer_bytes_per_token", ns)
    wrapped = v4.wrap_bytes_per_token(orig)
    assert orig(128, False) == 132 and wrapped(128, False) == 264 and wrapped(128, True) == orig(128, True)
    pool = types_pool(use_fp4_indexer=True)
    with pytest.raises(v4.V4Refused, match="fp4 indexer pools"):
        v4.wrap_create_buffer(lambda self: None)(pool)


def types_pool(**kw):
    import types

    return types.SimpleNamespace(index_head_dim=128, page_size=64, uses_aiter_fp4_layout=False, **kw)


def test_fp8_writes_and_reads_are_refused_with_bf16_keys(src, monkeypatch):
    store = v4.wrap_compress_norm_rope_store(lambda *a, **k: None)
    kv = torch.zeros(2, 128)
    with pytest.raises(v4.V4Refused, match="fp8 index-key write"):
        store(kv, None, norm_weight=None, norm_eps=1e-6, freq_cis=None, out_loc=None,
              kvcache=torch.zeros(1, 64 * 132, dtype=torch.uint8), page_size=64)
    with pytest.raises(v4.V4Refused, match="fp4/fp8 indexer store"):
        store(kv, None, use_fp4=True)
    monkeypatch.setattr(patching, "_installed", ("bf16", "niah"))
    before = attest.snapshot()["counts"].get("decode_logits.fp8", 0)
    with pytest.raises(v4.V4Refused, match="read fp8 index pages"):
        v4.paged_logits(None, torch.zeros(1, 64, 1, 132, dtype=torch.uint8), None, None, None, None, 64, False)
    assert attest.snapshot()["counts"]["decode_logits.fp8"] == before + 1
    fp8_keys = (torch.zeros(4, 128, dtype=torch.float8_e4m3fn), torch.ones(4))
    with pytest.raises(v4.V4Refused, match="non-paged prefill read fp8 index keys"):
        v4.mqa_logits(torch.zeros(2, 4, 128, dtype=torch.float8_e4m3fn), fp8_keys, torch.ones(2, 4),
                      torch.zeros(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32))


@pytest.mark.parametrize("argv,needle", [
    (["--enable-hierarchical-cache"], "HiCache"),
    (["--enable-hisparse"], "HiSparse"),
    (["--speculative-algorithm", "EAGLE"], "MTP"),
    (["--speculative-algorithm=NEXTN"], "MTP"),
    (["--enable-deepseek-v4-fp4-indexer"], "fp4"),
])
def test_launch_refuses_before_weights_load_with_one_line_and_exit_2(argv, needle):
    """Decided on SGLang 0.5.23's own parser (unpacked from the wheel; refusals.py)."""
    import subprocess

    from sglang_source import sglang_tree, with_sglang

    env = with_sglang(sglang_tree(), {k: v for k, v in os.environ.items() if k != "SGLANG_PLUGINS"})
    out = subprocess.run([sys.executable, "-m", "niah.serving.sglang", "--niah-index-dtype", "bf16",
                          "--model-path", "m", *argv], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 2 and needle in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("niah: error: ") and "is not supported with bf16/niah" in out.stderr


def test_the_pool_refuses_only_the_fp8_only_indexers():
    assert v4.env_refusal({}) is None  # SGLang's defaults: nothing to force, nothing to refuse
    assert v4.env_refusal({"SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1"}) is None
    assert "SGLANG_OPT_USE_TILELANG_INDEXER is on" in v4.env_refusal({"SGLANG_OPT_USE_TILELANG_INDEXER": "true"})
    assert "SGLANG_OPT_USE_AITER_INDEXER is on" in v4.env_refusal({"SGLANG_OPT_USE_AITER_INDEXER": "1"})
    assert v4.env_refusal({"SGLANG_OPT_USE_TILELANG_INDEXER": "0"}) is None


def test_v4_matrix_dry_run_stock_is_plain_sglang_and_bf16_adds_only_niahs_switches():
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "niah", "sweep", "--matrix",
                          str(repo / "serving/examples/sglang-v4.toml"), "--dry-run"],
                         capture_output=True, text=True, timeout=120, cwd=repo,
                         env={k: v for k, v in os.environ.items() if not k.startswith("NIAH_")})
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if " -m " in ln and not ln.startswith("#")]
    assert len(lines) == 6 and all("DeepSeek-V4-Flash" in ln for ln in lines)
    stock_all = [ln for ln in lines if " -m sglang.launch_server " in ln]
    stock = [ln for ln in stock_all if "--enable-deepseek-v4-fp4-indexer" not in ln]
    fp4 = [ln for ln in stock_all if "--enable-deepseek-v4-fp4-indexer" in ln]
    niah = [ln for ln in lines if " -m niah.serving.sglang " in ln]
    assert len(stock) == len(fp4) == len(niah) == 2
    for s_line, f_line, n_line in zip(stock, fp4, niah):
        sglang_args = s_line.split(" -m sglang.launch_server ")[1]
        assert n_line.endswith(" --niah-index-dtype bf16 --niah-kernels niah " + sglang_args)
        assert n_line.startswith("NIAH_INDEX_DTYPE=bf16 NIAH_KERNELS=niah ")
        assert f_line.replace(" --enable-deepseek-v4-fp4-indexer", "") == s_line   # the stock fp4 arm: one flag
        assert "SGLANG_" not in s_line + n_line and "--disable-prefill-cuda-graph" not in s_line + n_line
    diffs = [ln for ln in out.stdout.splitlines() if ln.startswith("# index_dtype:")]
    to_bf16 = [d for d in diffs if "fp8-" in d.split("->")[0] and "bf16-" in d]
    assert len(diffs) == 6 and len(to_bf16) == 2
    assert all(": 5 differences: launcher -m sglang.launch_server -> -m niah.serving.sglang; "
               "+ --niah-index-dtype bf16; + --niah-kernels niah; " in d for d in to_bf16)
    assert sum(d.endswith(": 1 difference: + --enable-deepseek-v4-fp4-indexer") for d in diffs) == 2


# ---------------------------------------------------------------------------------------
# SGLang's defaults: forward_c4_indexer imports DeepGEMM at call time; niah routes it.


@pytest.fixture
def deep_gemm(monkeypatch):
    """The `deep_gemm` module SGLang imports. DeepGEMM is CUDA (not installed on this machine):
    its functions here only say they were reached; the plugin routes the indexer's to niah."""
    import importlib.machinery
    import types

    mod = types.ModuleType("deep_gemm")
    mod.__spec__ = importlib.machinery.ModuleSpec("deep_gemm", None)

    def reached(*args, **kwargs):
        raise AssertionError("DeepGEMM itself was reached")

    mod.fp8_paged_mqa_logits = mod.fp8_mqa_logits = reached
    monkeypatch.setitem(sys.modules, "deep_gemm", mod)
    return mod


def test_pool_init_routes_deep_gemm_and_refuses_what_it_cannot(deep_gemm, monkeypatch):
    built = []
    init = v4.wrap_pool_init(lambda self: built.append(self))
    monkeypatch.setenv("SGLANG_OPT_USE_TILELANG_INDEXER", "1")
    with pytest.raises(v4.V4Refused, match="SGLANG_OPT_USE_TILELANG_INDEXER is on"):
        init("pool")
    assert built == [] and deep_gemm.fp8_paged_mqa_logits is not v4.paged_logits  # refused before anything
    monkeypatch.delenv("SGLANG_OPT_USE_TILELANG_INDEXER")
    init("pool")
    assert built == ["pool"] and attest.snapshot()["facts"]["deep_gemm"] == "routed"
    assert deep_gemm.fp8_paged_mqa_logits is v4.paged_logits and deep_gemm.fp8_mqa_logits is v4.mqa_logits
    monkeypatch.delitem(sys.modules, "deep_gemm")  # not installed at all
    with pytest.raises(v4.V4Refused, match="DeepGEMM is not installed"):
        v4.route_deep_gemm({})
    assert v4.route_deep_gemm({"SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1"}).startswith("deep_gemm absent")


def run_production(src, arm, inp, n, k, prefill: bool, dg):
    """ev.run_arm on SGLang's defaults: the lifted forward_c4_indexer imports `deep_gemm` itself
    (routed by the plugin); prefill = one eager request, which takes the non-paged path."""
    import types

    v4.route_deep_gemm({})
    seen = {}
    for name in v4.DEEP_GEMM_ROUTES:
        routed = getattr(dg, name)
        setattr(dg, name, lambda *a, _f=routed, _n=name, **kw: seen.setdefault(_n, _f(*a, **kw)))
    pool = v4_lift.make_pool(src, arm, int(inp["table"].max()) + 1, DEV)
    be = v4_lift.make_backend(src, arm, pool, {}, production=True)
    _, prefill_cls = be.plan_classes
    be.forward_metadata = types.SimpleNamespace(c4_compress_metadata=ev.prefill_plan(n, prefill_cls, DEV))
    be._forward_compress_all_in_one(
        kv_score_buffer=torch.zeros(1, 4, 4 * 128, device=DEV), kv_score_input=inp["kv"],
        ape=torch.zeros(8, 128, device=DEV), head_dim=128,
        norm=types.SimpleNamespace(weight=inp["weight"], variance_epsilon=ev.EPS), freqs_cis_cache=inp["freqs"],
        kv_cache=pool.get_index_k_with_scale_buffer(0).view(torch.uint8), is_indexer=True, rotate=True,
        compress_ratio=4, page_size=64, out_loc=ev.slots(inp, n))
    rows = inp["q8"].shape[0]
    meta = be.metadata_class(page_size=256, compressed_page_size=64,
                             page_table=inp["table"][None].expand(rows, -1).contiguous(),
                             compressed_seq_lens=torch.full((rows,), n, dtype=torch.int32, device=DEV),
                             use_topk_v2=False)
    core = types.SimpleNamespace(positions=torch.arange(rows, device=DEV),
                                 c4_sparse_page_indices=torch.empty(rows, k, dtype=torch.int32, device=DEV),
                                 c4_sparse_raw_indices=torch.empty(rows, k, dtype=torch.int32, device=DEV))
    be.forward_metadata = types.SimpleNamespace(indexer_metadata=meta, core_metadata=core)
    c4 = types.SimpleNamespace(layer_id=0, compressor=None, use_fp4_indexer=False, index_topk=k,
                               compute_weights=lambda x, skip_scale=False: inp["w"],
                               compute_q=lambda q_lora, positions, weights, q_lora_quant=None: (inp["q8"], weights))

    class Mode(str):
        def is_idle(self): return False
        def is_decode(self): return not prefill

    fb = types.SimpleNamespace(
        forward_mode=Mode("EXTEND" if prefill else "DECODE"), _original_forward_mode=None,
        tbo_parent_token_range=None, batch_size=1, seq_lens=torch.tensor([4 * n]), seq_lens_cpu=torch.tensor([4 * n]),
        extend_seq_lens_cpu=[rows], extend_seq_lens=torch.tensor([rows]), extend_start_loc=torch.tensor([0]),
        extend_num_tokens=rows)
    empty = torch.empty(rows, 1, device=DEV)
    be.forward_c4_indexer(x=empty, q_lora=empty, c4_indexer=c4, forward_batch=fb, skip_compressor=True)
    return seen, core.c4_sparse_raw_indices.long(), meta


@pytest.mark.parametrize("prefill", [False, True], ids=["decode-paged", "prefill-nonpaged"])
def test_bf16_on_sglangs_default_paths_without_any_flag(src, deep_gemm, monkeypatch, prefill):
    """No SGLang switch: decode through the paged function and a long single-request prefill
    through the non-paged one, both DeepGEMM's names, both reaching niah's bf16 kernels."""
    monkeypatch.setattr(patching, "_installed", ("bf16", "niah"))
    n, k = 300, 32
    inp = ev.make_inputs(n, rows=3, heads=8, seed=1, device=DEV)
    before = attest.snapshot()["counts"]
    seen, raw, meta = run_production(src, "bf16", inp, n, k, prefill, deep_gemm)
    after = attest.snapshot()["counts"]
    path = "prefill_logits" if prefill else "decode_logits"
    assert set(seen) == {"fp8_mqa_logits" if prefill else "fp8_paged_mqa_logits"}
    assert (meta.nonpaged_plan is not None) == prefill  # SGLang's own choice of path
    assert after.get(f"{path}.bf16", 0) == before.get(f"{path}.bf16", 0) + 1
    assert after.get(f"{path}.fp8", 0) == before.get(f"{path}.fp8", 0)
    ref = (torch.relu(torch.einsum("rhd,nd->rhn", inp["q8"].double(), ev.float64_keys(inp, n)))
           * inp["w"].double()).sum(1)
    want = ref.topk(k, dim=1).indices.sort(1).values
    assert torch.equal(raw.sort(1).values.cpu(), want.cpu())


def test_fp8_niah_arm_routes_deep_gemm_to_niahs_fp8_kernel(src, deep_gemm):
    """fp8/niah, SGLang's fp8 pages, no flag: DeepGEMM's paged function is niah's fp8 kernel,
    whose logits match SGLang's own torch fallback on the same pages."""
    n, k = 300, 32
    inp = ev.make_inputs(n, rows=3, heads=8, seed=4, device=DEV)
    seen, raw, _ = run_production(src, "fp8", inp, n, k, False, deep_gemm)
    logits_stock, raw_stock, _ = ev.run_arm(src, "fp8", inp, n, k, DEV)  # SGLang's torch fallback
    from niah.kernels import calc_diff

    assert calc_diff(seen["fp8_paged_mqa_logits"][:, :n].double(), logits_stock.double()) < 1e-5
    assert torch.equal(raw.sort(1).values, raw_stock.sort(1).values)
