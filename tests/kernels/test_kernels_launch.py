"""Direct launch of the compiled logits kernels (niah.kernels._launch).

CPU: the cache key partitions arguments exactly as Triton 3.6's own binder specialises them
(the real `create_function_from_signature` + `native_specialize_impl`, on the real kernels'
signatures); under TRITON_INTERPRET=1 every call goes through kernel[grid].
GPU (marker gpu): direct launch equals kernel[grid] bitwise, eagerly and in a CUDA graph, and
an argument that changes a specialisation gets its own cache entry."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton.language as tl

from niah.kernels import bf16_paged_mqa_logits, fp8_paged_mqa_logits
from niah.kernels._launch import DirectLauncher, specialize, via_triton
from test_kernels_mqa import make_case as prefill_case, run as prefill_run
from test_kernels_paged import make_case as paged_case

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
INTS = [0, 1, 2, 15, 16, 17, 48, -1, -16, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, -(2**31), -(2**31) - 1,
        -(2**31) - 16, 2**63 - 16, 2**63 - 1, 2**63, 2**64 - 16]


def _triton_spec(a):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    return native_specialize_impl(BaseBackend, a, False, True, True)


def _tensors():
    buf = torch.zeros(64, dtype=torch.uint8)
    out = []
    for dt in (torch.bfloat16, torch.float32, torch.int32, torch.float8_e4m3fn, torch.uint8):
        base = buf.view(dt)
        out += [base, base[1:], base[16 // base.element_size():]]  # aligned, off by one element, +16 bytes
    return out


def _same_partition(values, mine, theirs):
    for (i, a), (j, b) in itertools.combinations(enumerate(values), 2):
        assert (mine(a) == mine(b)) == (theirs(a) == theirs(b)), (values[i], values[j])


def test_specialize_partitions_like_triton():
    """Two arguments share a key exactly when Triton's native_specialize_impl treats them alike."""
    values = INTS + [0.5, 3.0, True, False, None] + _tensors()
    _same_partition(values, lambda a: specialize([a])[0], _triton_spec)


def test_specialize_passes_pointers_as_integers():
    t = _tensors()[1]
    key, vals = specialize([t, 7, 2.5])
    assert vals == [t.data_ptr(), 7, 2.5]
    assert key == ((torch.bfloat16, False), False, ("fp32", None))


def _jit(kernel):
    """The real kernel as a JITFunction (under the interpreter @triton.jit made an InterpretedFunction)."""
    from triton.runtime.jit import JITFunction

    return kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)


def _binder(jit):
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    return create_function_from_signature(jit.signature, jit.params, BaseBackend)


def _paged_variants():
    """Argument lists as the paged wrapper builds them, varied in dtype, alignment, ==1 and range."""
    q = torch.zeros(4096, dtype=torch.bfloat16)
    kv = torch.zeros(4096, dtype=torch.uint8)
    f32 = torch.zeros(512)
    i32 = torch.zeros(512, dtype=torch.int32)
    ints = [64, 4096, 64, 8192, 8192, 128, 64, 1, 64, 4096, 8448, 2112]
    base = [q, kv.view(torch.float8_e4m3fn), f32, f32, i32, i32, f32] + ints
    variants = [base]
    for pos, alt in [(0, q[1:]), (0, q[8:]), (1, kv), (2, f32[1:]), (6, f32[4:]),
                     (8, 4097), (8, 1), (8, 4112), (11, 1), (11, 2), (12, 17), (17, 2**31), (17, 2**31 + 1)]:
        v = list(base)
        v[pos] = alt
        variants.append(v)
    meta = dict(PAGES_PER_SPLIT=8, NEXT_N=1, CTX_2D=False, D=128, BLOCK_H=64, BLOCK_KV=64, IS_FP8=True,
                CLEAN=False, UPCAST=False, LIVE_LOOP=True, num_warps=4, num_stages=3)
    metas = [meta, dict(meta, CLEAN=True), dict(meta, num_stages=2), dict(meta, PAGES_PER_SPLIT=16)]
    return [(v, meta) for v in variants] + [(base, m) for m in metas[1:]]


def test_launcher_key_partitions_like_triton_binder_on_the_paged_kernel():
    """The full key (runtime specialisation + constexprs and options) against the binder that
    JITFunction.run uses, on paged_mqa_logits_kernel's real signature."""
    from niah.kernels.paged_logits.kernel import paged_mqa_logits_kernel

    binder = _binder(_jit(paged_mqa_logits_kernel))
    cases = _paged_variants()

    def mine(case):
        args, meta = case
        return specialize(args)[0], tuple(meta.items())

    def theirs(case):
        args, meta = case
        _, spec, options = binder(*args, **meta)
        return tuple(spec), str(options)

    _same_partition(cases, mine, theirs)
    # a misaligned pointer, another dtype, ==1, a non-multiple of 16, i64 range, a constexpr
    # or an option each make a new entry; a pointer 16 bytes on or 4096 -> 4112 do not
    assert 1 < len({mine(c) for c in cases}) < len(cases)


def test_launcher_wants_constexprs_last():
    from niah.kernels.mqa_logits.kernel import mqa_logits_kernel

    launcher = DirectLauncher(_jit(mqa_logits_kernel))
    assert launcher.compiled_mode and launcher.n_runtime == 16
    assert launcher.constexpr_names[0] == "D" and launcher.constexpr_names[-1] == "ACCUM"
    from triton.runtime.jit import JITFunction

    with pytest.raises(ValueError, match="constexpr parameters last"):
        DirectLauncher(JITFunction(_constexpr_in_the_middle))


def _constexpr_in_the_middle(x_ptr, BLOCK: tl.constexpr, n):
    tl.store(x_ptr + tl.arange(0, BLOCK), n)


@pytest.mark.skipif(GPU, reason="the interpreter path (CPU)")
def test_interpreter_goes_through_kernel_grid():
    """Under TRITON_INTERPRET=1 there is no compiled kernel: the wrappers' launchers fall back,
    and via_triton() (kernel[grid] by request) gives the same logits."""
    from niah.kernels.paged_logits.wrapper import _launcher

    q, kv, w, ctx, bt = paged_case("bf16", 2, 1, 16, 128, [100, 37], 128)
    a = bf16_paged_mqa_logits(q, kv, w, ctx, bt, None, 128, clean_logits=True)
    with via_triton():
        b = bf16_paged_mqa_logits(q, kv, w, ctx, bt, None, 128, clean_logits=True)
    assert not _launcher().compiled_mode and not _launcher().cache
    assert torch.equal(a, b) and torch.isfinite(a[0, :100]).all()


def _calls(kind):
    """(name, written, zero-argument call) of each wrapper on small cases (the cases of
    test_kernels_paged.py and test_kernels_mqa.py); `written` is None (clean_logits=True:
    every position) or the [rows, cols] mask of the positions clean_logits=False writes for sure."""
    from niah.kernels.paged_logits.reference import visible_lengths

    paged = fp8_paged_mqa_logits if kind == "fp8" else bf16_paged_mqa_logits
    pq, pkv, pw, pctx, pbt = paged_case(kind, 3, 1, 64, 128, [1000, 130, 64], 1024)
    nq, nkv, nw, nctx, nbt = paged_case(kind, 2, 2, 32, 128, [700, 90], 768, seed=3)
    scored = torch.arange(768, device=DEV)[None, :] < visible_lengths(nctx, 2, 2)[:, None]
    fq, fk, fsf, fw, fks, fke = prefill_case(kind, 64, [40, 9], [300, 20])
    return [
        ("paged", None, lambda: paged(pq, pkv, pw, pctx, pbt, None, 1024, clean_logits=True)),
        ("paged-next2-noclean", scored, lambda: paged(nq, nkv, nw, nctx, nbt, None, 768, clean_logits=False)),
        ("prefill", None, lambda: prefill_run(kind, fq, fk, fsf, fw, fks, fke, clean_logits=True)),
    ]


def _same(a, b, written):
    """Bitwise equal (where `written`, when given: clean_logits=False leaves the rest unwritten)."""
    return torch.equal(a, b) if written is None else torch.equal(a[written], b[written])


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA")
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_gpu_direct_launch_equals_kernel_grid_eager_and_in_a_graph(kind):
    for name, written, call in _calls(kind):
        with via_triton():
            want = call()
        first, again = call(), call()  # the first call fills the cache through Triton, the second is direct
        assert _same(first, want, written) and _same(again, want, written), name
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        out.fill_(0)
        graph.replay()
        torch.cuda.synchronize()
        assert _same(out, want, written), name


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA")
def test_gpu_a_new_specialisation_gets_its_own_entry():
    from niah.kernels.paged_logits.wrapper import _launcher

    launcher = _launcher()
    q, kv, w, ctx, bt = paged_case("bf16", 2, 1, 64, 128, [1000, 130], 1024)
    want = bf16_paged_mqa_logits(q, kv, w, ctx, bt, None, 1024, clean_logits=True)
    misses = launcher.misses
    q2 = q.clone()  # new tensors, same specialisation: no new entry
    assert torch.equal(bf16_paged_mqa_logits(q2, kv, w, ctx, bt, None, 1024, clean_logits=True), want)
    assert launcher.misses == misses
    flat = torch.empty(q.numel() + 1, dtype=q.dtype, device=DEV)
    q_odd = flat[1:].view(q.shape)  # q at an address 2 bytes past 16-byte alignment
    q_odd.copy_(q)
    assert torch.equal(bf16_paged_mqa_logits(q_odd, kv, w, ctx, bt, None, 1024, clean_logits=True), want)
    assert launcher.misses == misses + 1
    got = bf16_paged_mqa_logits(q, kv, w, ctx, bt, None, 1001, clean_logits=True)  # 1001 % 16 != 0
    assert launcher.misses == misses + 2
    assert torch.equal(got, want[:, :1001])


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA")
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_gpu_bound_plan_serves_repeated_shapes_with_new_pointers(kind):
    """After one checked call, a call with the same shapes goes through the bound plan (only
    the pointers new): same logits as Triton's launcher on fresh copies of every input; a
    misaligned pointer is not served by the plan and still gives the same logits."""
    from niah.kernels.mqa_logits import wrapper as mw
    from niah.kernels.paged_logits import wrapper as pw

    paged = fp8_paged_mqa_logits if kind == "fp8" else bf16_paged_mqa_logits
    case = paged_case(kind, 2, 1, 64, 128, [1000, 130], 1024, seed=11)
    with via_triton():
        want = paged(*case[:4], case[4], None, 1024, clean_logits=True)
    paged(*case[:4], case[4], None, 1024, clean_logits=True)
    assert pw._PLANS.get(pw._plan_key(*case, 1024, True, kind == "fp8")) is not None
    fresh = [t.clone() for t in case]
    assert torch.equal(paged(*fresh[:4], fresh[4], None, 1024, clean_logits=True), want)
    flat = torch.empty(case[0].numel() + 16, dtype=case[0].dtype, device=DEV)
    q_odd = flat[1:1 + case[0].numel()].view(case[0].shape)
    q_odd.copy_(case[0])
    assert torch.equal(paged(q_odd, *case[1:4], case[4], None, 1024, clean_logits=True), want)

    fq, fk, fsf, fw, fks, fke = prefill_case(kind, 64, [40, 9], [300, 20])
    with via_triton():
        want = prefill_run(kind, fq, fk, fsf, fw, fks, fke, clean_logits=True)
    prefill_run(kind, fq, fk, fsf, fw, fks, fke, clean_logits=True)
    assert len(mw._PLANS.plans) > 0
    fresh = [None if t is None else t.clone() for t in (fq, fk, fsf, fw, fks, fke)]
    assert torch.equal(prefill_run(kind, *fresh, clean_logits=True), want)


def test_host_benchmark_smoke_runs_end_to_end(tmp_path):
    """The host-cost benchmark's --smoke form (benchmarks/kernels/host.py; CPU, interpreter): every
    case runs, the DeepGEMM branch on its labelled stand-in, direct equals kernel[grid], the JSON
    is complete."""
    out = tmp_path / "host.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels" / "host.py"
    r = subprocess.run([sys.executable, str(script), "--smoke", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "DeepGEMM: " in r.stdout
    report = json.loads(out.read_text())
    assert report["info"]["smoke"] and "stand-in" in report["deepgemm"]
    rows = report["results"]
    assert [row["case"].split()[0] for row in rows] == ["decode"] * 4 + ["prefill"] * 2
    assert all(row["direct_equals_kernel_grid"] for row in rows)
    assert all(row["niah_direct"]["wall_us"] > 0 and row["niah_kernel_grid"]["host_us"] > 0 for row in rows)
    assert sum("deepgemm" in row for row in rows) == 3 and not any("deepgemm_error" in row for row in rows)
    assert report["cached_specialisations"]["direct"] is False  # the interpreter: kernel[grid] only


@pytest.mark.skipif(GPU, reason="the interpreter path (CPU)")
def test_the_server_path_launches_pass_every_constexpr_by_name(monkeypatch):
    """The attention and top-k wrappers launch through DirectLauncher, which on a GPU keeps
    each specialisation's constexpr values from the call's keywords (a constexpr left to its
    default would fail there at the first launch): each call here passes exactly the kernel's
    runtime parameters positionally and every constexpr by name (the interpreter runs them)."""
    import inspect

    from niah.kernels import topk_indices
    from niah.serving.embedded.cuda.attend import sparse_attention, union_attention

    seen = {}
    real = DirectLauncher.__call__

    def check(self, grid, *args, **meta):
        params = list(inspect.signature(self.kernel.fn).parameters.values())
        const = {p.name for p in params if "constexpr" in str(p.annotation)}
        assert len(args) == len(params) - len(const), self.kernel.fn.__name__
        assert const <= set(meta), (self.kernel.fn.__name__, const - set(meta))
        seen[self.kernel.fn.__name__] = seen.get(self.kernel.fn.__name__, 0) + 1
        return real(self, grid, *args, **meta)

    monkeypatch.setattr(DirectLauncher, "__call__", check)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 9, 3, 16, generator=g)
    k, v = torch.randn(1, 3, 80, 16, generator=g), torch.randn(1, 3, 80, 16, generator=g)
    idx = torch.stack([torch.randperm(70, generator=g)[:40] for _ in range(3)]).int()
    sparse_attention(q, k, v, idx, split_keys=16)
    union_attention(q, k, v, idx, block_q=4, block_n=16)
    x = torch.randn(2, 300, generator=g)
    topk_indices(x, 20)                                # few rows: the search
    topk_indices(x, 20, method="sample")               # the sample select (many rows' default)
    topk_indices(torch.randn(1, 9000, generator=g), 20, block=4096)   # chunk rounds
    topk_indices(x, 20, method="segmented", tile=128)  # the segmented select's four launches
    union_attention(q, k, v, idx, block_q=4, block_n=16, build="sort")
    assert set(seen) == {"sparse_attention_kernel", "sparse_attention_combine_kernel", "union_attention_kernel",
                         "tile_union_bitmap_kernel", "tile_union_kernel", "topk_kernel", "sample_topk_kernel",
                         "segment_bracket_kernel", "segment_count_kernel", "segment_scatter_kernel",
                         "segment_finish_kernel"}, seen
