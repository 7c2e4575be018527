"""The plugin contract against SGLang's real source (AST of the downloaded wheels): each supported
release against its own rows (0.5.16 and 0.5.23); mutations on 0.5.23's."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from niah.serving.sglang.contract import (
    PATCH_POINTS, SUPPORTED_VERSIONS, AstSource, InstalledSource, check_contract, points_for)
from niah.serving.sglang.contract import LAYOUT
from niah.serving.sglang.patches import points_of
from niah.serving.sglang.plugin import all_patches, patch_targets
from sglang_source import SGLANG_RELEASES, extract_tree, sglang_wheel

MODULES = sorted({p.module for p in PATCH_POINTS} | {c.module for c in LAYOUT})


@pytest.fixture(scope="module")
def wheel() -> Path:
    return sglang_wheel()


@pytest.fixture()
def tree(wheel, tmp_path) -> Path:
    """The contract's modules of the real wheel, unpacked (for mutation)."""
    return extract_tree(wheel, tmp_path, MODULES)


def _edit(tree: Path, module: str, old: str, new: str, count: int = 1) -> None:
    path = tree / (module.replace(".", "/") + ".py")
    text = path.read_text()
    assert old in text, f"{old!r} not in {module}"
    path.write_text(text.replace(old, new, count))


def test_supported_releases_are_the_wheels_tested():
    assert SUPPORTED_VERSIONS == SGLANG_RELEASES


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_contract_passes_on_each_release_wheel(release):
    wheel = sglang_wheel(release)
    report = check_contract(AstSource(wheel))
    assert report.ok, report.summary()
    assert report.version == release and report.version in SUPPORTED_VERSIONS
    assert report.checked == len(points_of(release))
    for dtype in ("fp8", "bf16"):
        assert check_contract(AstSource(wheel), points_for(dtype, release=release)).ok


def test_unpacked_tree_passes_before_mutation(tree):
    assert check_contract(AstSource(tree)).ok


def test_renamed_symbol_fails_naming_it(tree):
    mod = "sglang.srt.layers.attention.dsa.utils"
    _edit(tree, mod, "def resolve_fp8_paged_mqa_logits_fn(", "def resolve_fp8_paged_mqa_logits_fn_v2(")
    report = check_contract(AstSource(tree))
    assert not report.ok
    msg = report.summary()
    assert f"missing symbol {mod}.resolve_fp8_paged_mqa_logits_fn" in msg
    assert "sglang 0.5.23" in msg and "Supported SGLang versions: 0.5.16, 0.5.23" in msg
    # nothing else is blamed: the renamed function's own calls are new sites under its new name
    assert all(": new call site: resolve_fp8_paged_mqa_logits_fn_v2 calls " in p for p in report.problems[1:])
    assert len(report.problems) == 3, report.problems


def test_removed_parameter_fails_naming_symbol(tree):
    mod = "sglang.srt.layers.attention.dsa.dsa_indexer"
    _edit(tree, mod,
          "        out_cache_loc: Optional[torch.Tensor] = None,\n    ) -> None:\n        \"\"\"\n        Store DSA",
          "    ) -> None:\n        \"\"\"\n        Store DSA")
    report = check_contract(AstSource(tree))
    assert not report.ok
    assert any(p.startswith(f"{mod.replace('.', '/')}.py:1806: signature changed: {mod}.Indexer._store_index_k_cache")
               for p in report.problems), report.problems


def test_renamed_method_in_class_fails(tree):
    mod = "sglang.srt.mem_cache.index_key_cache"
    _edit(tree, mod, "def move(", "def move_v2(")
    report = check_contract(AstSource(tree), points_for("bf16"))
    assert f"missing symbol {mod}.IndexKeyCache.move" in report.summary()
    # fp8 mode does not touch the key buffer, so it still fits
    assert check_contract(AstSource(tree), points_for("fp8")).ok


def test_dropped_reference_fails(tree):
    mod = "sglang.srt.layers.attention.dsv4.indexer"
    _edit(tree, mod, "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "SGLANG_SOMETHING_ELSE", count=-1)
    report = check_contract(AstSource(tree))
    assert any("C4IndexerBackendMixin.forward_c4_indexer no longer references SGLANG_FP8_PAGED_MQA_LOGITS_TORCH" in p
               for p in report.problems), report.problems


def test_other_version_is_refused_by_name(tree):
    meta = next(tree.glob("sglang-*.dist-info/METADATA"))
    meta.write_text(meta.read_text().replace("Version: 0.5.23", "Version: 0.5.24", 1))
    report = check_contract(AstSource(tree))
    assert report.version == "0.5.24"
    assert "sglang 0.5.24" in report.summary() and "version 0.5.24 is not a supported version" in report.summary()
    assert report.problems == ["version 0.5.24 is not a supported version"]  # up front, nothing else checked


def test_missing_module_fails(tree):
    (tree / "sglang/srt/layers/attention/dsv4/indexer.py").unlink()
    report = check_contract(AstSource(tree))
    assert any(p.startswith("sglang/srt/layers/attention/dsv4/indexer.py: module missing: missing symbol "
                            "sglang.srt.layers.attention.dsv4.indexer.") for p in report.problems), report.problems


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_every_patch_is_a_contract_point_and_back(release):
    contract = {p.target for p in points_of(release) if p.action in ("replace", "wrap")}
    assert {p.target for p in all_patches(release)} == contract
    assert (set(patch_targets("fp8", "stock", release)) <= set(patch_targets("fp8", "niah", release))
            < set(patch_targets("bf16", release=release)))
    # niah's launcher never loads the plugin for fp8/stock; loaded by hand there it only counts
    assert not [p for p in all_patches(release) if p.when == "stock"]
    stock = [p for p in all_patches(release) if p.when in ("always", "fp8")]
    assert not any("logits" in p.target or "topk_paged" in p.target for p in stock)
    # SGLang's own top-k in every arm: counted, never replaced
    (topk,) = [p for p in all_patches(release) if "dsa_topk_backend" in p.target]
    assert topk.target.endswith("DSATopKBackend.topk_transform") and topk.when == "always"


def _params(fn) -> tuple[str, ...]:
    return tuple(p.name for p in inspect.signature(fn, follow_wrapped=False).parameters.values())


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_replacements_keep_the_replaced_signatures(release):
    """What SGLang calls must accept the same arguments as the original (contract params)."""
    by_target = {p.target: p for p in points_of(release)}
    for patch in all_patches(release):
        point = by_target[patch.target]
        if point.params is None:
            continue
        original = lambda *a, **k: None  # noqa: E731  (wrappers only close over it)
        got = _params(patch.factory(original))
        # pass-through counters take anything and hand it on unchanged
        assert got == point.params or got == ("args", "kwargs"), patch.target


def test_installed_source_without_sglang_is_of_unknown_version_and_refused():
    """No sglang package on sys.path (this machine): nothing to read, refused in one line."""
    src = InstalledSource()
    assert src.version is None and src.files() == {} and src.lookup("sglang.srt.plugins", "load_plugins") is None
    assert check_contract(src).problems == [
        "installed sglang: no SGLang version metadata (no sglang-*.dist-info/METADATA with a Version), so it "
        "cannot be told which SGLang this is"]


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_installed_source_reads_the_installed_package_as_the_wheel_is_read(release, monkeypatch):
    """The release's sources laid out as installed, first on sys.path (not imported): the same
    symbols as the wheel, among them the two an imported 0.5.16 hides (a custom op whose
    registration replaces the function; a local and a constant dict key in /server_info)."""
    import importlib
    import sys

    from sglang_source import sglang_tree

    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)  # another test of this worker may have imported one
    tree = sglang_tree(release)
    monkeypatch.syspath_prepend(str(tree))
    importlib.invalidate_caches()
    installed, wheel = InstalledSource(), AstSource(sglang_wheel(release))
    assert (installed.version, installed.path, installed.label) == (release, tree, "installed sglang")
    for p in points_of(release):
        a, b = installed.lookup(p.module, p.qualname), wheel.lookup(p.module, p.qualname)
        assert (a.params, a.names, a.where, a.text) == (b.params, b.names, b.where, b.text), p.target
    split = next(p for p in points_of(release) if p.qualname == "pcg_dsa_indexer_prefill_split")
    assert installed.lookup(split.module, split.qualname).params == split.params
    info = installed.lookup("sglang.srt.entrypoints.http_server", "server_info")
    assert {"internal_states", "get_internal_state"} <= info.names
    assert "sglang" not in sys.modules  # read, never imported


def test_apply_at_patches_real_modules(tmp_path, monkeypatch):
    """The plugin's patching on two real (generated) modules: functions, methods,
    staticmethods, `from X import f` copies, idempotency."""
    from niah.serving.sglang.plugin import apply_at

    pkg = tmp_path / "niahfakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "def f(x):\n    return x + 1\n\n"
        "class C:\n    @staticmethod\n    def s(x):\n        return x * 2\n\n"
        "    def m(self, x):\n        return x - 1\n")
    (pkg / "b.py").write_text("from niahfakepkg.a import f\n\ndef g(x):\n    return f(x)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import niahfakepkg.a as a
    import niahfakepkg.b as b

    calls = []

    def wrap(original):
        def new(*args):
            calls.append(args)
            return original(*args) * 10
        return new

    apply_at("niahfakepkg.a", "f", wrap)
    apply_at("niahfakepkg.a", "C.s", wrap)
    apply_at("niahfakepkg.a", "C.m", wrap)
    apply_at("niahfakepkg.a", "f", wrap)  # second install: no double wrap
    assert a.f(1) == 20 and b.g(1) == 20  # the from-import copy in b was rebound
    assert isinstance(a.C.__dict__["s"], staticmethod) and a.C.s(3) == 60 and a.C().s(3) == 60
    assert a.C().m(5) == 40
    import sys

    for name in ("niahfakepkg", "niahfakepkg.a", "niahfakepkg.b"):
        sys.modules.pop(name, None)


def test_a_copy_that_cannot_be_rebound_refuses_instead_of_half_patching(tmp_path, monkeypatch):
    """`from a import f` in a module whose attributes cannot be set (a real module object
    whose class refuses setattr, as read-only modules do): patching `f` must refuse with one
    line naming the copy, not leave that module calling the original."""
    import sys
    import types

    from niah.serving.sglang.plugin import PluginRefused, apply_at

    pkg = tmp_path / "niahfrozenpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f(x):\n    return x + 1\n")
    (pkg / "b.py").write_text("from niahfrozenpkg.a import f\n\ndef g(x):\n    return f(x)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import niahfrozenpkg.a  # noqa: F401
    import niahfrozenpkg.b as b

    class ReadOnlyModule(types.ModuleType):
        def __setattr__(self, name, value):
            raise AttributeError(f"module {self.__name__!r} is read-only")

    b.__class__ = ReadOnlyModule
    try:
        with pytest.raises(PluginRefused) as e:
            apply_at("niahfrozenpkg.a", "f", lambda original: (lambda x: original(x) * 10))
        msg = str(e.value)
        assert msg.startswith("cannot patch niahfrozenpkg.a.f: its copy niahfrozenpkg.b.f cannot be rebound "
                              "(AttributeError: module 'niahfrozenpkg.b' is read-only)"), msg
        assert "\n" not in msg
    finally:
        for name in ("niahfrozenpkg", "niahfrozenpkg.a", "niahfrozenpkg.b"):
            sys.modules.pop(name, None)


def test_key_flows_follow_the_pools_accessors_through_assignments_not_names():
    from niah.serving.sglang.contract.flows import scan_flows

    text = '''
class Indexer:
    def read(self, pool, layer_id, q):
        rows = pool.get_index_k_scale_buffer(layer_id)
        k, s = rows
        kv = (k.view(torch.float8_e4m3fn), s.squeeze(-1))
        width = k.shape[0]
        make_plan(width, q)
        if _is_xpu or _is_npu:
            out = whatever_kernel(q, kv)
        elif use_new:
            out = other(q, kv[0])
        else:
            def inner(x):
                return deep_kernel(x, kv)
            out = inner(q)
        return out
'''
    got = [(f.line, f.where, f.callee, f.guard) for f in scan_flows("m.py", text)]
    assert got == [
        (4, "Indexer.read", "pool.get_index_k_scale_buffer", ""),
        (10, "Indexer.read", "whatever_kernel", "(_is_xpu or _is_npu)"),
        (12, "Indexer.read", "other", "not ((_is_xpu or _is_npu)) and use_new"),
        (15, "Indexer.read.inner", "deep_kernel", ""),
    ]  # make_plan(width) reads a shape, not the keys


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_every_known_key_flow_lies_in_a_function_whose_call_sites_have_dispositions(release):
    """A flow's disposition is its function's (call_sites.py, sites_0516.py): none may sit where
    the release's call-site table says nothing."""
    from niah.serving.sglang.contract.tables import call_sites, known_flows

    functions = {(f, where) for (f, where, _, _) in call_sites(release)}
    orphans = [(f, where) for (f, where, _, _) in known_flows(release)
               if not any((f, ".".join(where.split(".")[:i])) in functions for i in range(1, where.count(".") + 2))]
    assert not orphans, orphans


def test_the_scan_cache_answers_only_for_exactly_the_same_inputs(tmp_path, monkeypatch):
    """A file's scan is read back for the same name and text; a changed text, a corrupt
    entry or an entry of another key is scanned again, and the answer is always the scan's."""
    import json
    import zipfile

    from niah.serving.sglang.contract.flows import Flow, scan_flows
    from niah.serving.sglang.contract.scan_cache import cached_scan, cached_selection

    monkeypatch.setenv("NIAH_CACHE", str(tmp_path))
    rel = "sglang/srt/layers/attention/dsa/dsa_indexer.py"
    with zipfile.ZipFile(sglang_wheel()) as z:
        text = z.read(rel).decode()
    calls = []

    def scan(r, t):
        calls.append(r)
        return scan_flows(r, t)

    first = cached_scan("flows", scan, rel, text, Flow)
    assert first and all(isinstance(f, Flow) for f in first) and calls == [rel]
    assert cached_scan("flows", scan, rel, text, Flow) == first and calls == [rel]  # read back, not scanned
    changed = text.replace("def _get_topk_paged(", "def _get_topk_paged_v2(")
    assert cached_scan("flows", scan, rel, changed, Flow) == scan_flows(rel, changed) and len(calls) == 2
    (entry,) = [p for p in tmp_path.rglob("*.json") if json.loads(p.read_text())["rows"] == [list(f) for f in first]]
    bads = ("{not json", json.dumps({"key": "another", "rows": []}), json.dumps({"key": entry.stem, "rows": [[1]]}))
    for bad in bads:
        entry.write_text(bad)
        assert cached_scan("flows", scan, rel, text, Flow) == first  # scanned again, rewritten
    assert len(calls) == 5
    monkeypatch.setenv("NIAH_CONTRACT_CACHE", "0")
    assert cached_scan("flows", scan, rel, text, Flow) == first and len(calls) == 6
    monkeypatch.delenv("NIAH_CONTRACT_CACHE")
    texts = {"a.py": "x = 1", "b.py": "index_k(1)"}
    assert cached_selection(texts, lambda r, t: "index_k" in t) == ["b.py"]
    assert cached_selection(texts, lambda r, t: True) == ["b.py"]  # read back: the same inputs
    assert cached_selection({**texts, "a.py": "index_k(2)"}, lambda r, t: "index_k" in t) == ["a.py", "b.py"]
