"""Launch a Triton kernel's compiled binary directly, without Triton's Python launcher.

`kernel[grid](*args, **meta)` binds and specialises every argument, builds its cache key as
a string, looks up device and stream, then calls the compiled launcher: ~40 us of host
time a call for our 20-argument kernels on the H200's host (docs/kernels.md), more than the kernel
itself at B=1. `DirectLauncher(kernel)(grid, *args, **meta)` sends the first call of each
specialisation through Triton (it compiles, launches and returns the CompiledKernel), keeps
that CompiledKernel under a key of exactly what Triton 3.6 specialises on, and later calls
its launcher itself, as `JITFunction.run` does:
    compiled.run(gx, gy, gz, stream, compiled.function, compiled.packed_metadata,
                 launch_metadata, enter_hook, exit_hook, *args)   (constexpr values included)
The key (JITFunction.run -> create_function_from_signature -> native_specialize_impl):
  tensor: dtype, data_ptr % 16 == 0      int: == 1 (a constexpr then), i32 / i64 / u64 by
  range, % 16 == 0                       float: fp32   bool: u1   None: constexpr None
  plus the constexpr and option values (num_warps, num_stages, ...) and the current device.
No launch metadata and no hooks are passed (None): the hook chains are empty unless a
profiler installs one, and then the call goes through Triton.
Pointers are passed to the launcher as integers (it then skips its per-tensor data_ptr()
call and driver pointer query; the wrappers check the device). The stream is looked up on
every call (a CUDA graph captures on its own stream), through Triton's own lookup function,
resolved once.
`bind(grid, args, meta)` goes one step further for the wrappers' repeated calls (SGLang's
eager decode calls the same shapes step after step): a `BoundLaunch` whose grid, scalar
arguments and specialisation are fixed, called with the device and the tensor pointers
only, straight into the compiled C launcher. The wrappers keep one per distinct shape key
(`PlanCache`) and use it only when every pointer is 16-byte aligned (so any specialisation
is valid for it) and `direct_ok()`.
Falls back to kernel[grid], the one place it does: under TRITON_INTERPRET=1 (the kernel is
an InterpretedFunction, there is no binary), with a Triton launch hook installed (a
profiler), or inside `via_triton()` (for comparisons and benchmarks).
"""

from __future__ import annotations

import contextlib
import functools
import importlib

import torch

_I32_MIN, _I32_MAX, _I64_MAX = -(2**31), 2**31 - 1, 2**63 - 1
_FORCE_TRITON = False
_RUNTIME_KNOBS = None  # triton.knobs.runtime, looked up at the first direct_ok()


@contextlib.contextmanager
def via_triton():
    """Within this block every DirectLauncher launches through kernel[grid] (Triton's launcher)."""
    global _FORCE_TRITON
    saved, _FORCE_TRITON = _FORCE_TRITON, True
    try:
        yield
    finally:
        _FORCE_TRITON = saved


def _int_spec(v: int):
    """Key of a Python int as Triton specialises it: 1 is a constexpr; otherwise i32 / i64 /
    u64 by range and divisibility by 16 (i32: the bool alone, as specialize's fast path)."""
    if v == 1:
        return ("constexpr", 1)
    if _I32_MIN <= v <= _I32_MAX:
        return v % 16 == 0
    return ("i64" if v <= _I64_MAX else "u64", v % 16 == 0)


def _other_spec(a):
    if type(a) is bool:
        return ("u1", None)
    if type(a) is float:
        return ("fp32", None)
    if a is None:
        return ("constexpr", None)
    raise TypeError(f"DirectLauncher: unsupported runtime argument of type {type(a).__name__}")


def specialize(args) -> tuple[tuple, list]:
    """(key, launch values) of the runtime arguments: the key holds what Triton specialises
    on (equal keys -> equal Triton specialisations), the values are what its launcher takes."""
    key, vals = [], []
    for a in args:
        if type(a) is int:
            key.append(a % 16 == 0 if 1 < a <= _I32_MAX else _int_spec(a))
            vals.append(a)
        elif isinstance(a, torch.Tensor):
            p = a.data_ptr()
            key.append((a.dtype, p % 16 == 0))
            vals.append(p)
        else:
            key.append(_other_spec(a))
            vals.append(a)
    return tuple(key), vals


def direct_ok() -> bool:
    """Whether direct launches may run now (not inside via_triton(), no Triton launch hook)."""
    global _RUNTIME_KNOBS
    if _FORCE_TRITON:
        return False
    rk = _RUNTIME_KNOBS
    if rk is None:
        from triton import knobs  # noqa: PLC0415 (triton loads at first launch: TRITON_INTERPRET may be set until then)

        rk = _RUNTIME_KNOBS = knobs.runtime
    return not (getattr(rk.launch_enter_hook, "calls", rk.launch_enter_hook)
                or getattr(rk.launch_exit_hook, "calls", rk.launch_exit_hook))


class BoundLaunch:
    """One compiled specialisation with its grid and scalar arguments fixed:
    `bound(device_index, *pointers)` launches it with new tensor pointers (ints, the leading
    runtime arguments in order) on the device's current stream."""

    __slots__ = ("_launch", "_grid", "_function", "_flags", "_packed", "_tail", "_stream")

    def __init__(self, c_launch, grid, function, flags, packed, tail, stream):
        self._launch, self._grid, self._function = c_launch, grid, function
        self._flags, self._packed, self._tail, self._stream = flags, packed, tail, stream

    def __call__(self, device: int, *ptrs: int) -> None:
        g = self._grid
        self._launch(g[0], g[1], g[2], self._stream(device), self._function, self._flags[0], self._flags[1],
                     None, None, self._packed, None, None, None, *ptrs, *self._tail)


class PlanCache:
    """Bound launches of one wrapper by shape key, at most `size` of them (oldest dropped)."""

    def __init__(self, size: int = 256):
        self.size, self.plans = size, {}

    def get(self, key):
        return self.plans.get(key)

    def put(self, key, plan) -> None:
        if plan is None or key in self.plans:
            return
        if len(self.plans) >= self.size:
            self.plans.pop(next(iter(self.plans)))
        self.plans[key] = plan


class DirectLauncher:
    """Call `launcher(grid, *runtime_args, **constexprs_and_options)` where you would call
    `kernel[grid](*runtime_args, **constexprs_and_options)`. Runtime arguments positional,
    constexprs by name; the kernel's constexpr parameters must come after its runtime ones."""

    def __init__(self, kernel):
        self.kernel = kernel
        params = getattr(kernel, "params", None)
        self.compiled_mode = params is not None and hasattr(kernel, "device_caches")
        self.cache: dict = {}
        self.misses = 0
        if not self.compiled_mode:
            return  # interpreter: kernel[grid] only
        n_rt = sum(not p.is_constexpr for p in params)
        if any(p.is_constexpr for p in params[:n_rt]):
            raise ValueError(f"DirectLauncher: {kernel} must list its constexpr parameters last")
        if any(p.do_not_specialize or p.do_not_specialize_on_alignment or p.annotation_type for p in params[:n_rt]):
            raise ValueError(f"DirectLauncher: {kernel} has annotated or unspecialised parameters (not handled)")
        self.n_runtime = n_rt
        self.constexpr_names = tuple(p.name for p in params[n_rt:])
        from triton import knobs  # noqa: PLC0415 (triton loads at first launch: TRITON_INTERPRET may be set until then)

        self._runtime_knobs = knobs.runtime
        self._stream = self._device = None  # Triton's driver lookups, resolved at the first call

    def _resolve_driver(self) -> None:
        from triton.runtime import driver  # noqa: PLC0415 (triton loads at first launch: TRITON_INTERPRET may be set until then)

        self._stream = driver.active.get_current_stream  # torch._C._cuda_getCurrentRawStream
        self._device = getattr(torch._C, "_cuda_getDevice", None) or driver.active.get_current_device

    def _hooks_idle(self) -> bool:
        """Triton 3.6's launch hooks are HookChains (empty unless a profiler added one)."""
        rk = self._runtime_knobs
        return not (getattr(rk.launch_enter_hook, "calls", rk.launch_enter_hook)
                    or getattr(rk.launch_exit_hook, "calls", rk.launch_exit_hook))

    def __call__(self, grid, *args, **meta):
        if not self.compiled_mode or _FORCE_TRITON or not self._hooks_idle():
            return self.kernel[grid](*args, **meta)
        if self._device is None:
            self._resolve_driver()
        key, vals = specialize(args)
        device = self._device()
        full_key = (device, key, tuple(meta.items()))
        entry = self.cache.get(full_key)
        if entry is None:
            return self._first_call(full_key, grid, args, meta)
        run, function, packed, cvals = entry
        run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, self._stream(device),
            function, packed, None, None, None, *vals, *cvals)

    def _first_call(self, full_key, grid, args, meta):
        """Through Triton (compiles if needed, launches); keep what the launcher needs."""
        if len(args) != self.n_runtime:
            raise TypeError(f"DirectLauncher: {self.kernel} takes {self.n_runtime} runtime arguments, got {len(args)}")
        compiled = self.kernel[grid](*args, **meta)
        if hasattr(compiled, "result"):
            compiled = compiled.result()
        cvals = tuple(meta[name] for name in self.constexpr_names)
        self.cache[full_key] = (compiled.run, compiled.function, compiled.packed_metadata, cvals)
        self.misses += 1

    def bind(self, grid, args, meta) -> BoundLaunch | None:
        """The BoundLaunch of a call that already ran (its specialisation is cached), with
        the leading tensor arguments left open; None where a direct launch cannot serve it
        (interpreter, scratch memory, tensor descriptors, a tensor after a scalar)."""
        if not self.compiled_mode or self._device is None:
            return None
        n_ptr = 0
        while n_ptr < len(args) and isinstance(args[n_ptr], torch.Tensor):
            n_ptr += 1
        if any(isinstance(a, torch.Tensor) for a in args[n_ptr:]):
            return None
        key, vals = specialize(args)
        entry = self.cache.get((self._device(), key, tuple(meta.items())))
        if entry is None:
            return None
        run, function, packed, cvals = entry
        c_launch = getattr(run, "launch", None)
        if (c_launch is None or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)
                or not callable(c_launch) or getattr(c_launch, "__name__", "") == "inner"):
            return None
        g = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        flags = (run.launch_cooperative_grid, run.launch_pdl)
        return BoundLaunch(c_launch, g, function, flags, packed, (*vals[n_ptr:], *cvals), self._stream)


@functools.cache
def launcher_of(module: str, kernel: str) -> DirectLauncher:
    """The DirectLauncher of `module.kernel`, made at its first use (importing the kernel's
    module then, not when the wrapper is imported)."""
    return DirectLauncher(getattr(importlib.import_module(module), kernel))
