"""`niah doctor`: SGLang version, plugin contract (against the 0.5.23 wheel, and 0.5.16's), torch/Triton facts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sglang_source import mutated_wheel, sglang_wheel


def _doctor(*args):
    """`niah doctor ARGS` through the real entry point, in this process (tests/cli_inproc.py):
    the contract check is what is tested, not the interpreter start."""
    from cli_inproc import niah

    return niah("doctor", *args)


def test_doctor_reports_contract_against_the_wheel():
    wheel = sglang_wheel()
    r = _doctor("--sglang-source", str(wheel))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "plugin contract OK: sglang 0.5.23" in out
    assert "sglang installed" in out and "torch " in out and "triton" in out and "GPU" in out
    assert "plugin supports sglang  0.5.16, 0.5.23" in out


def _listed(out: str) -> list[str]:
    """The --points rows: action, arm, releases, target."""
    return [" ".join(line.split("  -- ")[0].split()) for line in out.splitlines() if "  -- " in line]


def test_doctor_bf16_only_points_and_bad_inputs(tmp_path):
    from niah.serving.sglang.patches import points_for

    wheel = sglang_wheel()
    r = _doctor("--sglang-source", str(wheel), "--index-dtype", "bf16", "--points")
    assert r.returncode == 0 and "plugin contract OK" in r.stdout
    rows = _listed(r.stdout)  # the checked source's release's rows, each with the releases it holds for
    assert "replace bf16 0.5.23 sglang.srt.mem_cache.index_key_cache.IndexKeyCache.get_k_and_scale" in rows
    assert "uses always all sglang.srt.plugins.load_plugins" in rows
    assert len(rows) == len(points_for("bf16", release="0.5.23")) and not any(" 0.5.16 " in x for x in rows)
    r = _doctor("--sglang-source", str(sglang_wheel("0.5.16")), "--index-dtype", "bf16", "--points")
    assert r.returncode == 0 and "plugin contract OK: sglang 0.5.16" in r.stdout, r.stdout
    rows = _listed(r.stdout)
    assert "replace bf16 0.5.16 sglang.srt.mem_cache.memory_pool.DSATokenToKVPool.get_index_k_scale_buffer" in rows
    assert len(rows) == len(points_for("bf16", release="0.5.16")) and not any(" 0.5.23 " in x for x in rows)
    r = _doctor("--sglang-source", str(tmp_path / "nope.whl"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "not found" in r.stderr
    r = _doctor("--index-dtype", "fp16")
    assert r.returncode == 2 and "fp8 or bf16" in r.stderr


def test_doctor_fails_on_a_mismatched_source(tmp_path):
    from niah.serving.sglang.contract import PATCH_POINTS
    from niah.serving.sglang.contract import LAYOUT
    from sglang_source import extract_tree

    tree = extract_tree(sglang_wheel(), tmp_path, sorted({p.module for p in PATCH_POINTS} | {c.module for c in LAYOUT}))
    f = tree / "sglang/srt/mem_cache/index_key_cache.py"
    f.write_text(f.read_text().replace("def get_k_and_scale(", "def get_keys_and_scales("))
    r = _doctor("--sglang-source", str(tree))
    assert r.returncode == 2  # fail closed: the plugin would refuse this source too
    assert ("contract break          sglang/srt/mem_cache/index_key_cache.py:107 (closest: get_keys_and_scales): "
            "missing symbol sglang.srt.mem_cache.index_key_cache.IndexKeyCache.get_k_and_scale") in r.stdout


# -- mutated copies of the real wheel: one test per kind of break ------------------------------
def _breaks(r) -> list[str]:
    assert r.returncode == 2, r.stdout + r.stderr
    return [line.split(None, 2)[2] for line in r.stdout.splitlines() if line.startswith("contract break")]


DSA_IDX = "sglang/srt/layers/attention/dsa/dsa_indexer.py"


def test_mutated_wheel_new_direct_deep_gemm_call_next_to_the_resolver(tmp_path):
    """A caller change the symbol checks cannot see: decode calls DeepGEMM directly."""
    old = "                return resolve_fp8_paged_mqa_logits_fn()("
    new = ("                import deep_gemm\n\n"
           "                deep_gemm.fp8_paged_mqa_logits(q_fp8, kv_cache_fp8, weights)\n"
           + old)
    whl = mutated_wheel(tmp_path, {DSA_IDX: (old, new)})
    brk, flow = _breaks(_doctor("--sglang-source", str(whl)))
    assert brk.startswith(f"{DSA_IDX}:1351: new call site: Indexer._get_topk_paged._chunked_fp8_paged_mqa_logits "
                          "calls deep_gemm.fp8_paged_mqa_logits"), brk
    assert flow == (f"{DSA_IDX}:1351: new data flow: Indexer._get_topk_paged._chunked_fp8_paged_mqa_logits hands "
                    "index keys to deep_gemm.fp8_paged_mqa_logits when `batch_size <= self.sm_count`, which the "
                    "contract does not know"), flow  # the outer function's keys, read in the closure


def test_mutated_wheel_scale_bytes_changed(tmp_path):
    ikc = "sglang/srt/mem_cache/index_key_cache.py"
    whl = mutated_wheel(tmp_path, {ikc: ("pool.index_head_dim // pool.quant_block_size * 4",
                                         "pool.index_head_dim // pool.quant_block_size * 8")})
    (brk,) = _breaks(_doctor("--sglang-source", str(whl)))
    assert brk.startswith(
        f"{ikc}:40: layout changed: sglang.srt.mem_cache.index_key_cache.IndexKeyCache._buffer_shape"), brk


def test_mutated_wheel_quant_block_changed(tmp_path):
    mp = "sglang/srt/mem_cache/memory_pool.py"
    whl = mutated_wheel(tmp_path, {mp: ("    quant_block_size = 128\n", "    quant_block_size = 64\n")})
    (brk,) = _breaks(_doctor("--sglang-source", str(whl)))
    assert brk.startswith(
        f"{mp}:5280: layout changed: sglang.srt.mem_cache.memory_pool.DSATokenToKVPool.quant_block_size"), brk


def test_mutated_wheel_accounting_row_changed(tmp_path):
    pc = "sglang/srt/model_executor/pool_configurator.py"
    whl = mutated_wheel(tmp_path, {pc: ("index_head_dim + index_head_dim // DSATokenToKVPool.quant_block_size * 4,\n"
                                        "            get_dsa_index_kpool",
                                        "index_head_dim + 8,\n            get_dsa_index_kpool")})
    brks = _breaks(_doctor("--sglang-source", str(whl)))
    assert any(b.startswith(f"{pc}:560: layout changed: ") and "132 bytes a token" in b for b in brks), brks


def test_mutated_wheel_page_size_changed(tmp_path):
    whl = mutated_wheel(tmp_path, {DSA_IDX: ("block_tables = metadata.get_page_table_64()",
                                             "block_tables = metadata.get_page_table_1()")})
    brks = _breaks(_doctor("--sglang-source", str(whl)))
    assert any(b.startswith(f"{DSA_IDX}:1219: layout changed: ") and "get_page_table_64()" in b for b in brks), brks


def test_mutated_wheel_removed_parameter_names_file_and_line(tmp_path):
    old = "        out_cache_loc: Optional[torch.Tensor] = None,\n    ) -> None:\n        \"\"\"\n        Store DSA"
    whl = mutated_wheel(tmp_path, {DSA_IDX: (old, "    ) -> None:\n        \"\"\"\n        Store DSA")})
    (brk,) = _breaks(_doctor("--sglang-source", str(whl)))
    assert brk.startswith(f"{DSA_IDX}:1806: signature changed: sglang.srt.layers.attention.dsa.dsa_indexer."
                          "Indexer._store_index_k_cache"), brk


def test_mutated_wheel_dropped_reference_names_file_and_line(tmp_path):
    utils = "sglang/srt/layers/attention/dsa/utils.py"
    whl = mutated_wheel(tmp_path, {utils: ("    if _use_torch_mqa_logits():\n"
                                           "        return _fp8_paged_mqa_logits_torch",
                                           "    if False:\n        return _fp8_paged_mqa_logits_torch")})
    (brk,) = _breaks(_doctor("--sglang-source", str(whl)))
    assert brk.startswith(f"{utils}:457: sglang.srt.layers.attention.dsa.utils.resolve_fp8_paged_mqa_logits_fn "
                          "no longer references _use_torch_mqa_logits"), brk


def test_mutated_wheel_renamed_symbol_names_where_it_went(tmp_path):
    utils = "sglang/srt/layers/attention/dsa/utils.py"
    whl = mutated_wheel(tmp_path, {utils: ("def resolve_fp8_mqa_logits_fn(", "def resolve_fp8_mqa_logits_fn_v2(")})
    brks = _breaks(_doctor("--sglang-source", str(whl)))
    assert brks[0].startswith(f"{utils}:499 (closest: resolve_fp8_mqa_logits_fn_v2): missing symbol "
                              "sglang.srt.layers.attention.dsa.utils.resolve_fp8_mqa_logits_fn"), brks


@pytest.mark.parametrize("version, ok", [("0.5.23.post1", True), ("0.5.23+cu130", True),
                                         ("0.5.23.post2+cu129", True), ("0.5.24", False), ("0.5.23rc1", False)])
def test_a_0_5_23_build_is_accepted_only_on_its_source_other_versions_refused(tmp_path, version, ok):
    whl = mutated_wheel(tmp_path, {}, version=version)
    r = _doctor("--sglang-source", str(whl))
    if ok:
        assert r.returncode == 0 and f"plugin contract OK: sglang {version}" in r.stdout, r.stdout
        assert (f"sglang build            {version} is a build of 0.5.23, not the 0.5.23 release: accepted only "
                "because its own source passes the same contract check") in r.stdout, r.stdout
    else:
        assert _breaks(r) == [f"version {version} is not a supported version"]


# -- each a break the check used to miss, each exit 2 naming file:line ---------


def test_new_deep_gemm_kernel_called_in_the_indexer_is_a_break(tmp_path):
    """Any DeepGEMM name, not a fixed list: a kernel niah has never heard of."""
    old = "        assert len(kv_cache_fp8.shape) == 2\n        block_kv = page_size\n"
    new = ("        import deep_gemm\n\n        deep_gemm.fp8_paged_mqa_logits_v2(q_fp8, kv_cache_fp8, weights)\n"
           + old)
    whl = mutated_wheel(tmp_path, {DSA_IDX: (old, new)})
    brk, flow = _breaks(_doctor("--sglang-source", str(whl)))
    assert brk == (f"{DSA_IDX}:1326: new call site: Indexer._get_topk_paged calls deep_gemm.fp8_paged_mqa_logits_v2, "
                   "which niah neither patches, refuses nor lists as unreachable"), brk
    assert flow == (f"{DSA_IDX}:1326: new data flow: Indexer._get_topk_paged hands index keys to "
                    "deep_gemm.fp8_paged_mqa_logits_v2 unconditionally, which the contract does not know"), flow


def test_changed_fp8_row_width_is_a_break(tmp_path):
    """The decode path's page view (132 = 128 values + 4 scale bytes) is a layout constant."""
    whl = mutated_wheel(tmp_path, {DSA_IDX: ("        head_dim_with_sf = 132\n", "        head_dim_with_sf = 136\n")})
    (brk,) = _breaks(_doctor("--sglang-source", str(whl)))
    assert brk.startswith(f"{DSA_IDX}:1219: layout changed: sglang.srt.layers.attention.dsa.dsa_indexer."
                          "Indexer._get_topk_paged no longer says `head_dim_with_sf = 132`"), brk


def test_a_new_place_writing_the_row_width_is_a_break(tmp_path):
    old = "        assert len(kv_cache_fp8.shape) == 2\n        block_kv = page_size\n"
    new = "        row_bytes = self.head_dim + 4\n" + old
    whl = mutated_wheel(tmp_path, {DSA_IDX: (old, new)})
    (brk,) = _breaks(_doctor("--sglang-source", str(whl)))
    assert brk.startswith(f"{DSA_IDX}:1324: new layout constant: Indexer._get_topk_paged writes the fp8 row width "
                          "as `self.head_dim + 4`"), brk


def test_duplicated_call_site_is_a_break(tmp_path):
    """A site is (file, function, callee, count): a second identical call is new."""
    old = ("        self._store_index_k_cache(\n            forward_batch=forward_batch,\n"
           "            layer_id=layer_id,\n")
    new = ("        self._store_index_k_cache(forward_batch=forward_batch, layer_id=layer_id, key=key, "
           "act_quant=act_quant, out_cache_loc=out_cache_loc)\n" + old)
    whl = mutated_wheel(tmp_path, {DSA_IDX: (old, new)})
    (brk,) = _breaks(_doctor("--sglang-source", str(whl)))
    assert brk == (f"{DSA_IDX}:1062: call count changed: Indexer._fused_k_prepare_and_store calls "
                   "_store_index_k_cache 2 time(s), the contract knows 1"), brk


def test_post_release_with_a_broken_source_is_refused(tmp_path):
    old = "        assert len(kv_cache_fp8.shape) == 2\n        block_kv = page_size\n"
    new = "        import deep_gemm\n\n        deep_gemm.fp8_paged_mqa_logits_v2(q_fp8, kv_cache_fp8, weights)\n" + old
    whl = mutated_wheel(tmp_path, {DSA_IDX: (old, new)}, version="0.5.23.post3")
    r = _doctor("--sglang-source", str(whl))
    brk, flow = _breaks(r)
    assert brk.startswith(f"{DSA_IDX}:1326: new call site: Indexer._get_topk_paged calls "
                          "deep_gemm.fp8_paged_mqa_logits_v2")
    assert flow.startswith(f"{DSA_IDX}:1326: new data flow: Indexer._get_topk_paged hands index keys to ")
    assert ("sglang build            0.5.23.post3 is a build of 0.5.23: not accepted, its source fails the "
            "contract check") in r.stdout, r.stdout
    assert "plugin contract         BROKEN: 2 break(s) against sglang 0.5.23.post3" in r.stdout


def test_plugin_install_refuses_a_broken_source_in_one_line(tmp_path):
    """The plugin in a process where the mutated SGLang is the installed one: SGLang's loader
    would swallow an exception, so the plugin itself prints one line and exits 2."""
    from sglang_source import unpack_python, with_sglang

    old = "        assert len(kv_cache_fp8.shape) == 2\n        block_kv = page_size\n"
    new = ("        import deep_gemm\n\n        deep_gemm.fp8_paged_mqa_logits_v2(q_fp8, kv_cache_fp8, weights)\n"
           + old)
    tree = unpack_python(mutated_wheel(tmp_path, {DSA_IDX: (old, new)}, version="0.5.23.post1"), tmp_path / "tree")
    code = "from niah.serving.sglang.plugin import sglang_plugin\nsglang_plugin()\nprint('served anyway')\n"
    env = with_sglang(tree) | {"NIAH_INDEX_DTYPE": "bf16"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 2 and "served anyway" not in r.stdout, r.stdout + r.stderr
    ours = [line for line in r.stderr.splitlines() if line.startswith("niah:")]
    assert len(ours) == 1 and r.stderr.rstrip().endswith(ours[0]), r.stderr
    assert ours[0].startswith("niah: error: niah's SGLang plugin does not fit sglang 0.5.23.post1 (installed sglang): ")
    assert (f"{DSA_IDX}:1326: new call site: Indexer._get_topk_paged calls deep_gemm.fp8_paged_mqa_logits_v2"
            in ours[0]), ours[0]


# -- data flow: where the index keys go, whatever the callee is called -------------------------
RAGGED_NO_CHUNK = "        if not need_chunk:\n            assert q_fp8[:q_offset].shape[0] != 0\n"


def test_a_new_kernel_reading_the_keys_behind_a_new_switch_is_a_break(tmp_path):
    """A callee no name pattern knows, fed the prefill's fp8 keys (a view of the pool's
    get_index_k_scale_buffer) behind a switch of its own."""
    new = ("        if envs.SGLANG_NEW_RAGGED_KERNEL.get():\n"
           "            return new_ragged_kernel(q_fp8, kv_fp8, weights, ks, ke)\n" + RAGGED_NO_CHUNK)
    whl = mutated_wheel(tmp_path, {DSA_IDX: (RAGGED_NO_CHUNK, new)})
    (brk,) = _breaks(_doctor("--sglang-source", str(whl)))
    assert brk == (f"{DSA_IDX}:1576: new data flow: Indexer._get_topk_ragged hands index keys to new_ragged_kernel "
                   "when `envs.SGLANG_NEW_RAGGED_KERNEL.get()`, which the contract does not know"), brk


def test_cuda_sent_down_another_platforms_kernel_is_a_break(tmp_path):
    """`elif _is_xpu:` widened to `elif _is_xpu or _is_cuda:`: CUDA prefill would hand the keys
    to sgl_kernel's fp8 kernel instead of the resolver niah patches."""
    old = "                elif _is_xpu:\n                    logits = sgl_fp8_mqa_logits("
    whl = mutated_wheel(tmp_path, {DSA_IDX: (old, old.replace("_is_xpu:", "_is_xpu or _is_cuda:"))})
    brks = _breaks(_doctor("--sglang-source", str(whl)))
    assert (f"{DSA_IDX}:1596: branch changed: Indexer._get_topk_ragged hands index keys to sgl_fp8_mqa_logits "
            "when `not need_chunk and not (_is_hip) and (_is_xpu or _is_cuda)`; the contract knows it only when "
            "`not need_chunk and not (_is_hip) and _is_xpu`; when `not (_is_hip) and _is_xpu`") in brks, brks
    assert any(b.startswith(f"{DSA_IDX}:1608: branch changed: Indexer._get_topk_ragged hands index keys to "
                            "resolve_fp8_mqa_logits_fn() when `not need_chunk and not (_is_hip) and not "
                            "((_is_xpu or _is_cuda))`") for b in brks), brks
    assert len(brks) == 2, brks


def test_a_tree_without_version_metadata_is_refused(tmp_path):
    import shutil

    from niah.serving.sglang.contract import LAYOUT, PATCH_POINTS
    from sglang_source import extract_tree

    tree = extract_tree(sglang_wheel(), tmp_path, sorted({p.module for p in PATCH_POINTS} | {c.module for c in LAYOUT}))
    for info in tree.glob("*.dist-info"):
        shutil.rmtree(info)
    brks = _breaks(_doctor("--sglang-source", str(tree)))
    assert brks[0] == (f"{tree}: no SGLang version metadata (no sglang-*.dist-info/METADATA with a Version), so it "
                       "cannot be told which SGLang this is"), brks
