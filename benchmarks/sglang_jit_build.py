"""Build SGLang 0.5.23's own JIT CUDA kernels as its loader does, from its own source.

    python benchmarks/sglang_jit_build.py build --sglang-src TREE --out DIR [--only a,b] [--jobs N] [--no-gpu]
    python benchmarks/sglang_jit_build.py extract --wheel SGLANG_WHEEL --dest TREE   (what .carry needs)

Nothing imports sglang. What runs is SGLang's code, compiled by AST from a copy of its files
(TREE holds `sglang/...` as in the wheel): the ops' module factories (`_jit_*_module`, e.g.
kernels/ops/attention/dsa/indexer_k.py) called with the production arguments against a
`load_jit` that records the request (module args, .cuh files, wrappers, extra flags);
`BuildSpec` and `_wrapper_source` (jit/utils/compile/spec.py: tvm-ffi's includes, `#include`
of the .cuh, `namespace sglang { TVM_FFI_DLL_EXPORT_TYPED_FUNC(...) }`); `ninja.generate` and
`ninja.build` (compile/ninja.py) with the toolchain's flags (compile/toolchain.py, utils/arch.py:
-gencode=arch=compute_90a,code=sm_90a -DSGL_CUDA_ARCH=900 -std=c++20 -O3
--expt-relaxed-constexpr, tvm-ffi's include paths and library). Restated from loader.py
`load_jit` (its lines ~93-118): assembling the BuildSpec from the request. Left out: the build
cache and its lock (every build goes to a fresh folder). topk_v2 asks the cluster-occupancy
probe (itself a JIT module) first, as SGLang does; --no-gpu (compile check on a machine
without a GPU) uses the H200 defaults written in topk_v2.cuh instead.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import dataclasses
import enum
import functools
import json
import logging
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
import types
import typing
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from v4_lift import Envs, Source  # noqa: E402

JIT = "sglang.kernels.jit"
CMP = f"{JIT}.utils.compile"
OPS = "sglang.kernels.ops"
ARCH = (9, 0)  # the H200

# name -> (module, factory, production arguments): what the evidence runs, as production builds it
MODULES = {
    "v32_k_norm_rope": (f"{OPS}.attention.dsa.indexer_k", "_jit_k_indexer_norm_rope_module", ("bf16",)),
    "v32_k_norm_rope_store": (f"{OPS}.attention.dsa.indexer_k", "_jit_k_indexer_norm_rope_store_module",
                              ("bf16", 64)),
    "v32_q_rope_quant": (f"{OPS}.attention.dsa.indexer_q", "_jit_main_q_indexer_rope_first_quant_module", ("bf16",)),
    "v4_norm_rope_store": (f"{OPS}.attention.dsv4.compress", "_jit_compress_norm_rope_module",
                           ("bf16", 128, 64, 64, False, "v4")),
    "hadamard": (f"{OPS}.quantization.hadamard", "_jit_hadamard_module", ("bf16",)),
    "cluster_probe": (f"{JIT}.utils.occupancy", "_jit_probe_module", ()),
    "topk_v2": (f"{OPS}.attention.dsv4.topk", "_jit_topk_v2_module", ()),
}
# the files a build (and the evidence's lifting) reads, relative to the wheel's root
CUDA_SOURCES = ("deepseek_v32/indexer_k.cuh", "deepseek_v4/main_norm_rope.cuh", "deepseek_v4/fused_norm_rope_v2.cuh",
                "deepseek_v4/topk_v2.cuh", "occupancy/cluster_probe.cuh", "fast-hadamard-transform/")
PY_SOURCES = tuple(m.replace(".", "/") + ".py" for m in (
    f"{JIT}.utils.arch", f"{JIT}.utils.occupancy", f"{CMP}.spec", f"{CMP}.paths", f"{CMP}.toolchain",
    f"{CMP}.ninja", f"{CMP}.cpp_args", f"{OPS}.attention.dsa.indexer_k", f"{OPS}.attention.dsa.indexer_q",
    f"{OPS}.attention.dsv4.compress", f"{OPS}.attention.dsv4.topk", f"{OPS}.attention.dsv4.utils",
    f"{OPS}.attention.dsv4.kv_layout", f"{OPS}.quantization.hadamard", f"{OPS}.quantization.act_quant_triton",
    "sglang.srt.layers.attention.dsa.dsa_topk_backend",
    # what tests/kernels/test_kernels_v32_store.py lifts (the driver zips these as a stand-in wheel for it)
    "sglang.srt.layers.layernorm", "sglang.srt.layers.rotary_embedding.utils",
    "sglang.srt.layers.rotary_embedding.base"))
TOPK_V2_HEADER_DEFAULTS = {(8, 2): 30, (16, 1): 0}  # topk_v2.cuh: SGL_TOPK_V2_MAX_C8_OCC2 (H200), C16_OCC1


def lift(src: Source, module: str, name: str, ns: dict):
    """Compile SGLang's top-level `name` (function, class, or `NAME = ...`) from its source into
    ns and return it. Decorators are dropped (cache_once, register_custom_op; @dataclass is
    re-applied, and a msgspec.Struct class becomes a dataclass); `from sglang... import` lines
    inside a function are dropped, so ns must already hold the names they import."""
    tree = ast.parse(src.text(module))
    node = next((n for n in tree.body if getattr(n, "name", None) == name or any(
        getattr(t, "id", None) == name for t in getattr(n, "targets", [getattr(n, "target", None)]))), None)
    if node is None:
        raise LookupError(f"{name} not found in {module} (SGLang's source changed?)")
    decorators = [ast.unparse(d) for d in getattr(node, "decorator_list", [])]
    if decorators:
        node.decorator_list = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.FunctionDef):
            sub.body = [s for s in sub.body if not _sglang_import(s, ns, f"{module}.{name}")] or [ast.Pass()]
    import __future__

    code = compile(textwrap.dedent(ast.unparse(node)), f"<sglang {module}.{name}>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, ns)
    obj = ns[name]
    if "dataclass" in decorators or isinstance(node, ast.ClassDef) and any(
            ast.unparse(b) == "msgspec.Struct" for b in node.bases):
        obj = ns[name] = dataclasses.dataclass(obj)
    return obj


def _sglang_import(stmt, ns: dict, where: str) -> bool:
    """True for `from sglang... import names` (dropped); refuses one whose names ns lacks."""
    if not (isinstance(stmt, ast.ImportFrom) and (stmt.module or "").startswith("sglang")):
        return False
    missing = [a.asname or a.name for a in stmt.names if (a.asname or a.name) not in ns]
    if missing:
        raise LookupError(f"{where} imports {missing} from {stmt.module}: put them in its namespace")
    return True


class _Struct:
    """msgspec.Struct's role for the lifted BuildSpec / TranslationUnit (made dataclasses)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__()


def _nvcc_version(cuda_home: str) -> tuple[int, int]:
    out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _base_ns() -> dict:
    return {"torch": __import__("torch"), "os": os, "re": re, "shlex": shlex, "shutil": shutil,
            "subprocess": subprocess, "pathlib": pathlib, "logging": logging, "enum": enum,
            "functools": functools, "logger": logging.getLogger("sglang_jit_build"), "envs": Envs(),
            "List": typing.List, "Tuple": typing.Tuple, "Optional": typing.Optional, "Union": typing.Union,
            "Callable": typing.Callable, "TypeAlias": typing.Any, "Literal": typing.Literal,
            "msgspec": types.SimpleNamespace(Struct=_Struct), "dataclass": dataclasses.dataclass,
            "is_hip_runtime": lambda: False, "is_sail_runtime": lambda: False, "is_musa_runtime": lambda: False}


class Loader:
    """SGLang's JIT build pieces, lifted from `src` (a tree holding sglang/kernels/jit/...)."""

    def __init__(self, src_root: Path, arch=ARCH, tvm_ffi_paths=None):
        self.src = Source(src_root)
        self.kernel_path = Path(src_root).resolve() / "sglang" / "kernels" / "jit"
        ns = self.ns = _base_ns()
        ns["KERNEL_PATH"] = self.kernel_path
        for name in ("ArchInfo", "_cuda_arch_suffix", "get_default_target_flags", "is_arch_support_pdl"):
            lift(self.src, f"{JIT}.utils.arch", name, ns)
        ns["_jit_cuda_version"] = lambda: _nvcc_version(ns["cuda_home"]())
        for name in ("cuda_home", "rocm_home", "device_compiler_path", "host_compiler_path", "tvm_ffi_paths",
                     "target_flags", "base_cxx_flags", "base_cuda_flags", "base_include_paths", "base_link_flags",
                     "compilers"):
            lift(self.src, f"{CMP}.toolchain", name, ns)
        self.arch = ns["ArchInfo"](arch[0], arch[1], ns["_cuda_arch_suffix"](*arch))
        ns["get_jit_cuda_arch"] = lambda: self.arch
        if tvm_ffi_paths is not None:  # a machine whose Python cannot import the carried tvm-ffi
            ns["tvm_ffi_paths"] = lambda: tvm_ffi_paths
        ns["toolchain"] = types.SimpleNamespace(**{k: ns[k] for k in (  # ninja.py's `toolchain.` calls
            "base_cxx_flags", "base_cuda_flags", "target_flags", "base_include_paths", "base_link_flags",
            "compilers")})
        for name in ("_MODULE_NAME_PREFIX", "TranslationUnit", "BuildSpec", "_FFI_INCLUDES", "_wrapper_source",
                     "resolve_sources"):
            lift(self.src, f"{CMP}.spec", name, ns)
        for name in ("DEFAULT_INCLUDE", "DEFAULT_CFLAGS", "DEFAULT_LDFLAGS"):
            lift(self.src, f"{CMP}.paths", name, ns)
        for name in ("_BUILD_FILE", "_NINJA_TIMEOUT_S", "_escape", "_arg", "_quote_path_flags", "generate", "build"):
            lift(self.src, f"{CMP}.ninja", name, ns)
        for name in ("CPPArgList", "CPP_DTYPE_MAP", "make_cpp_args"):
            lift(self.src, f"{CMP}.cpp_args", name, ns)
        kv = self.ns_kv = _base_ns()
        lift(self.src, f"{OPS}.attention.dsv4.kv_layout", "KVLayout", kv)
        lift(self.src, f"{OPS}.attention.dsv4.kv_layout", "_INTERLEAVED_ENCODING", kv)
        self.KVLayout = kv["KVLayout"]

    def _value(self, a):
        torch = self.ns["torch"]
        return {"bf16": torch.bfloat16, "v4": self.KVLayout.parse("v4")}.get(a, a) if isinstance(a, str) else a

    def request(self, name: str, probe=None) -> dict:
        """Call SGLang's module factory for `name` with its production arguments; returns the
        load_jit request it makes. probe(cluster_size, occupancy) -> clusters, for topk_v2."""
        module, factory, args = MODULES[name]
        calls = []
        ns = dict(self.ns)
        ns.update(load_jit=lambda *a, **kw: calls.append((a, kw)) or (a, kw), KVLayout=self.KVLayout,
                  INDEXER_K_CACHE_PRESHUFFLE_TILE=16,  # dsa/utils.py; unused on CUDA:
                  aiter_can_use_preshuffle_paged_mqa=lambda: False)  # returns False when not is_hip()
        lift(self.src, f"{OPS}.attention.dsv4.utils", "make_name", ns)
        if module.endswith("indexer_k"):
            lift(self.src, module, "_CUDA_FILE", ns)
        if name == "topk_v2":
            occ = f"{JIT}.utils.occupancy"
            lift(self.src, occ, "NoSchedulableClustersError", ns)
            ns["_get_max_active_clusters"] = probe or (lambda c, o: TOPK_V2_HEADER_DEFAULTS[(c, o)])
            lift(self.src, occ, "get_max_active_clusters", ns)
        lift(self.src, module, factory, ns)(*[self._value(a) for a in args])
        (a, kw), = calls
        return {"args": [str(x) for x in a], **kw}

    def spec(self, req: dict):
        """loader.py load_jit's BuildSpec, restated (header-only CUDA modules, no dependencies)."""
        ns, kw = self.ns, dict(req)
        args = kw.pop("args")
        unknown = set(kw) - {"cuda_files", "cuda_wrappers", "extra_cuda_cflags", "extra_include_paths"}
        if unknown:
            raise ValueError(f"load_jit options this build does not reproduce: {sorted(unknown)}")
        return ns["BuildSpec"](
            module_args=tuple(args), cpp_files=(), cuda_files=ns["resolve_sources"](kw.get("cuda_files")),
            cpp_wrappers=(), cuda_wrappers=tuple(tuple(w) for w in kw.get("cuda_wrappers") or ()),
            cflags=tuple(ns["DEFAULT_CFLAGS"]),
            cuda_cflags=tuple(ns["get_default_target_flags"]() + list(kw.get("extra_cuda_cflags") or [])),
            ldflags=tuple(ns["DEFAULT_LDFLAGS"]),
            include_paths=tuple(list(ns["DEFAULT_INCLUDE"]) + list(kw.get("extra_include_paths") or [])),
            header_only=True)

    def build(self, req: dict, out: Path) -> dict:
        """ninja.generate + ninja.build into out/<module_name>; returns a manifest entry."""
        spec = self.spec(req)
        build_file = self.ns["generate"](spec)
        entry = {"module_name": spec.module_name, "request": req, "build_ninja": build_file,
                 "wrapper_source": spec.translation_units()[0].source}
        folder = Path(out) / spec.module_name
        shutil.rmtree(folder, ignore_errors=True)
        t = time.time()
        try:
            so = self.ns["build"](spec=spec, build_dir=folder, build_file=build_file)
            entry.update(ok=True, so=str(so))
        except Exception as e:  # noqa: BLE001 - recorded, the other builds go on
            entry.update(ok=False, error=str(e)[-6000:])
        entry["seconds"] = round(time.time() - t, 1)
        return entry


def load_module(entry: dict):
    import tvm_ffi

    return tvm_ffi.load_module(entry["so"])


def build_all(loader: Loader, names, out: Path, jobs: int, gpu: bool) -> dict:
    """Every module in parallel; topk_v2 after the occupancy probe it needs (on the GPU)."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    first = [n for n in names if n != "topk_v2"]
    if "topk_v2" in names and gpu and "cluster_probe" not in first:
        first.append("cluster_probe")
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
        futures = {n: ex.submit(loader.build, loader.request(n), out) for n in first}
        for n, f in futures.items():
            manifest[n] = f.result()
            print(f"{'built' if manifest[n]['ok'] else 'FAILED'} {n} ({manifest[n]['module_name']}) "
                  f"in {manifest[n]['seconds']} s", flush=True)
    if "topk_v2" in names:
        probed = {}

        def probe(c, o):
            mod = load_module(manifest["cluster_probe"])
            probed[f"{c},{o}"] = int(mod.get_max_active_clusters(c, o))
            return probed[f"{c},{o}"]
        try:
            req = loader.request("topk_v2", probe if gpu and manifest["cluster_probe"]["ok"] else None)
        except Exception as e:  # noqa: BLE001 - SGLang would fail here; build with the header's H200 values
            probed["probe_error"] = f"{type(e).__name__}: {e}"[:500]
            req = loader.request("topk_v2")
        manifest["topk_v2"] = loader.build(req, out)
        manifest["topk_v2"]["cluster_probe"] = probed if "probe_error" not in probed and probed else {
            **probed, "used": "topk_v2.cuh H200 defaults"}
        print(f"{'built' if manifest['topk_v2']['ok'] else 'FAILED'} topk_v2 "
              f"{json.dumps(manifest['topk_v2']['cluster_probe'])} in {manifest['topk_v2'].get('seconds')} s",
              flush=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def extract(wheel: Path, dest: Path) -> list[str]:
    """Copy the files a build and the evidence read out of SGLang's wheel into dest."""
    jit = "sglang/kernels/jit/"
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if not n.endswith("/") and (
            n.startswith(jit + "include/") or n in PY_SOURCES
            or any(n.startswith(jit + "csrc/" + s) for s in CUDA_SOURCES))]
        for n in names:
            (dest / n).parent.mkdir(parents=True, exist_ok=True)
            (dest / n).write_bytes(z.read(n))
    return names


def tvm_ffi_paths_of(folder: Path):
    """(include dirs, library dir, library name) of an unpacked tvm-ffi wheel, as libinfo gives them."""
    return ((str(folder / "include"),), str(folder / "lib"), "tvm_ffi")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--sglang-src", required=True, type=Path, help="a tree holding sglang/kernels/jit/...")
    b.add_argument("--out", required=True, type=Path)
    b.add_argument("--only", default="", help="comma-separated module names (default: all)")
    b.add_argument("--jobs", type=int, default=8)
    b.add_argument("--no-gpu", action="store_true", help="compile check only: topk_v2 gets the header defaults")
    b.add_argument("--tvm-ffi-dir", type=Path, help="an unpacked tvm_ffi package (when it cannot be imported)")
    e = sub.add_parser("extract")
    e.add_argument("--wheel", required=True, type=Path)
    e.add_argument("--dest", required=True, type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "extract":
        print(f"{len(extract(a.wheel, a.dest))} files from {a.wheel.name} into {a.dest}")
        return 0
    names = [n for n in a.only.split(",") if n] or list(MODULES)
    bad = [n for n in names if n not in MODULES]
    if bad:
        print(f"unknown module(s) {bad}; known: {list(MODULES)}", file=sys.stderr)
        return 2
    loader = Loader(a.sglang_src, tvm_ffi_paths=tvm_ffi_paths_of(a.tvm_ffi_dir) if a.tvm_ffi_dir else None)
    manifest = build_all(loader, names, a.out, a.jobs, gpu=not a.no_gpu)
    failed = [n for n, m in manifest.items() if not m["ok"]]
    for n in failed:
        print(f"--- {n} failed:\n{manifest[n].get('error', '')[-3000:]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
