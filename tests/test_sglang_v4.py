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

from niah.serving.sglang import attest, plugin, v4  # noqa: E402
from niah.serving.sglang.contract import AstSource, check_contract, points_for  # noqa: E402
from sglang_source import extract_tree, sglang_wheel  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
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
    assert len(v4_patches) == 13 and v4_patches <= {p.target for p in points_for("bf16", "niah")}


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
        old, new = "head_dim_with_sf = 68 if use_fp4_indexer else 132", "head_dim_with_sf = 68 if use_fp4_indexer else 136"
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
    monkeypatch.setattr(plugin, "_installed", ("bf16", "niah"))
    before = attest.snapshot()["counts"].get("decode_logits.fp8", 0)
    with pytest.raises(v4.V4Refused, match="read fp8 index pages"):
        v4.paged_logits(None, torch.zeros(1, 64, 1, 132, dtype=torch.uint8), None, None, None, None, 64, False)
    assert attest.snapshot()["counts"]["decode_logits.fp8"] == before + 1
    with pytest.raises(v4.V4Refused, match="non-paged DeepGEMM"):
        v4.refuse_nonpaged_mqa_logits(q_indexer=None, weights=None, kv=None, plan=None, rows=None)


@pytest.mark.parametrize("argv,needle", [
    (["--enable-hierarchical-cache"], "HiCache"),
    (["--enable-hisparse"], "HiSparse"),
    (["--speculative-algorithm", "EAGLE"], "MTP"),
    (["--speculative-algorithm=NEXTN"], "MTP"),
    (["--enable-deepseek-v4-fp4-indexer"], "fp4"),
])
def test_launch_refuses_before_weights_load_with_one_line_and_exit_2(argv, needle):
    import subprocess

    from niah.serving.sglang.command import refusal

    problem = refusal("bf16", "niah", ["--model-path", "m", *argv])
    assert problem and needle in problem
    out = subprocess.run([sys.executable, "-m", "niah.serving.sglang", "--niah-index-dtype", "bf16",
                          "--model-path", "m", *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and needle in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_launch_accepts_plain_args_and_the_pool_checks_the_kernel_env():
    from niah.serving.sglang.command import refusal

    assert refusal("bf16", "niah", ["--model-path", "m", "--speculative-algorithm", "NONE"]) is None
    assert "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH" in v4.env_refusal({})
    assert "TILELANG" in v4.env_refusal({"SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1",
                                         "SGLANG_OPT_USE_TILELANG_INDEXER": "true"})
    assert v4.env_refusal({"SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1", "SGLANG_OPT_USE_TILELANG_INDEXER": "0"}) is None


def test_v4_matrix_dry_run_arms_differ_only_in_index_dtype():
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "niah", "sweep", "--matrix",
                          str(repo / "serving/examples/sglang-v4.toml"), "--dry-run"],
                         capture_output=True, text=True, timeout=120, cwd=repo)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if "-m niah.serving.sglang" in ln]
    assert len(lines) == 4 and "DeepSeek-V4-Flash" in lines[0]
    assert all(ln.split().count("--disable-prefill-cuda-graph") == 1 for ln in lines)
    # fp8/stock vs bf16/niah: the index dtype and what the kernels value implies, nothing else
    kernel_env = {"SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1", "SGLANG_OPT_USE_TILELANG_INDEXER=0"}
    by_topk: dict[str, list[set]] = {}
    for ln in lines:
        # only the arguments after the interpreter: its path is the checkout's (any folder
        # name, e.g. one with "niah", "fp8" or "1024" in it) and the same in every arm
        env_and_argv = ln.split()
        at = env_and_argv.index("-m")
        words = [*env_and_argv[:at - 1], *env_and_argv[at:]]
        tokens = {w.replace("bf16", "DTYPE").replace("fp8", "DTYPE").replace("stock", "KERNELS")
                  .replace("niah", "KERNELS").replace("KERNELS.serving", "niah.serving") for w in words}
        by_topk.setdefault("k1024" if '{"index_topk": 1024}' in ln else "k512", []).append(tokens)
    for fp8, bf16 in by_topk.values():
        assert fp8 ^ bf16 == kernel_env and kernel_env <= bf16
    diffs = [ln for ln in out.stdout.splitlines() if ln.startswith("# index_dtype:")]
    assert len(diffs) == 2 and all("--niah-kernels stock -> --niah-kernels niah" in d for d in diffs)
