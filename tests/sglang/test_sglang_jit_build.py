"""benchmarks/sglang_jit_build.py against SGLang 0.5.23's real source (the wheel): the build it
prepares for the H200 is the one SGLang's loader would make, and the files it carries suffice.

No compiler runs here (nvcc on the CPU machine: see the helper's `build --no-gpu`); what is
checked is what a wrong lift or a too-short carry list would break: each production module
factory's request, the generated wrapper against the real .cuh, the nvcc flags of the generated
build.ninja, the transitive include closure of every built .cuh within the extracted files, and
that SGLang's Python wrappers lift and run (on torch stand-ins) from those files alone.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import sglang_jit_build as jb  # noqa: E402
from sglang_source import sglang_wheel  # noqa: E402

TVM = (("/tvm-ffi/include",), "/tvm-ffi/lib", "tvm_ffi")
KERNEL = {  # module -> the C++ class (or function) its wrappers name, as written in the .cuh
    "v32_k_norm_rope": "struct FusedKIndexerNormRopeKernel",
    "v32_k_norm_rope_store": "struct FusedKIndexerNormRopeStoreKernel",
    "v32_q_rope_quant": "struct FusedQIndexerRopeHadamardQuantKernel",
    "v4_norm_rope_store": "struct FusedNormRopeKernel", "hadamard": "struct HadamardKernel",
    "cluster_probe": "uint32_t get_max_active_clusters(", "topk_v2": "struct TopKKernel"}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    dest = tmp_path_factory.mktemp("sglang-src")
    jb.extract(sglang_wheel(), dest)
    return dest


@pytest.fixture(scope="module")
def loader(tree):
    return jb.Loader(tree, tvm_ffi_paths=TVM)


@pytest.mark.parametrize("name", list(jb.MODULES))
def test_request_wrapper_and_flags(loader, tree, name):
    req = loader.request(name)
    spec = loader.spec(req)
    src = spec.translation_units()[0].source
    for cuh in spec.cuda_files:
        assert Path(cuh).is_file(), f"{cuh} not extracted (CUDA_SOURCES)"
        assert f'#include "{cuh}"' in src
        assert KERNEL[name] in Path(cuh).read_text(), f"{KERNEL[name]} not in {cuh}"
    assert src.startswith("#include <tvm/ffi/container/tensor.h>") and "namespace sglang {" in src
    for export, kernel in req["cuda_wrappers"]:
        assert f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({export}, ({kernel}));" in src
    ninja = loader.ns["generate"](spec)
    flags = re.search(r"^cudaflags = (.*)$", ninja, re.M).group(1).split()
    for f in ("-gencode=arch=compute_90a,code=sm_90a", "-DSGL_CUDA_ARCH=900", "-std=c++20", "-O3",
              "--expt-relaxed-constexpr", "-I/tvm-ffi/include", f"-I{loader.kernel_path / 'include'}"):
        assert f in flags, f"{f} missing from {flags}"
    assert re.search(r"^ldflags = -shared -L/tvm-ffi/lib -ltvm_ffi .*-lcudart$", ninja, re.M)
    assert spec.module_name == "sgl_kernel_jit_" + "_".join(req["args"])


def test_production_template_arguments(loader):
    """The instantiations production uses on an H200 (bf16 activations, PDL on, page 64, V4 layout)."""
    wrappers = {n: dict(loader.request(n)["cuda_wrappers"]) for n in ("v32_k_norm_rope_store", "v32_q_rope_quant",
                                                                       "v4_norm_rope_store", "topk_v2")}
    assert wrappers["v32_k_norm_rope_store"]["forward"] == "FusedKIndexerNormRopeStoreKernel<bf16_t, true, 64>::forward"
    assert wrappers["v32_q_rope_quant"]["forward"] == \
        "FusedQIndexerRopeHadamardQuantKernel<bf16_t, true, true, false>::forward"  # rope first, no Hadamard
    assert wrappers["v4_norm_rope_store"]["forward"] == \
        "FusedNormRopeKernel<bf16_t, 128, 64, 64, 0, false, V4, true>::forward"
    assert set(wrappers["topk_v2"]) >= {"topk_transform_paged", "topk_transform_ragged", "topk_plan"}
    probed = jb.Loader.request(loader, "topk_v2", probe=lambda c, o: {(8, 2): 29, (16, 1): 0}[(c, o)])
    assert probed["extra_cuda_cflags"] == ["-DSGL_TOPK_V2_MAX_C8_OCC2=29", "-DSGL_TOPK_V2_MAX_C16_OCC1=0"]


def test_carried_files_close_every_include(loader, tree):
    """Every header a built .cuh reaches (<sgl_kernel/...>, "local.h") is in the extracted tree."""
    include = loader.kernel_path / "include"
    todo = [Path(f) for n in jb.MODULES for f in loader.spec(loader.request(n)).cuda_files]
    seen = set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        for kind, name in re.findall(r'#include\s*([<"])([^>"]+)[>"]', f.read_text()):
            cand = include / name if kind == "<" else f.parent / name
            if kind == "<" and not name.startswith("sgl_kernel/"):
                continue  # tvm-ffi, dlpack, CUDA, the C++ library
            assert cand.is_file(), f"{f.name} includes {name}, not carried"
            todo.append(cand)
    assert len(seen) > 20


def test_sglang_wrappers_lift_from_the_carried_files(tree):
    """SGLang's op wrappers, lifted from the extracted files only, run on the torch stand-ins."""
    from sglang_jit_ops import Ops, StandIns

    ops = Ops(tree, StandIns.modules(), smoke=True)
    key = torch.randn(6, 192).bfloat16()[:, :128]
    cs = torch.randn(16, 64)
    pre = ops.k_norm_rope(key, torch.ones(128), torch.zeros(128), 1e-6, cs, torch.arange(6))
    assert pre.shape == (6, 128) and pre.dtype == torch.bfloat16 and pre.is_contiguous()
    q8, w = ops.q_rope_quant(torch.randn(3, 4, 128).bfloat16(), torch.randn(3, 4).bfloat16(), 0.5, cs,
                             torch.arange(3))
    assert q8.dtype == torch.float8_e4m3fn and w.shape == (3, 4, 1)
    plan = ops.plan_topk_v2(torch.tensor([5, 3], dtype=torch.int32))
    assert plan.shape == (3, 2) and plan.dtype == torch.int32
