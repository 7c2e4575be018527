"""Index-key forms: the one table of the precisions an indexer's keys may be stored in.

Every place that accepts, sizes, quantises, serves or attests an index dtype reads this
table: `niah serve --index-dtype`, the matrix file's keys, the SGLang arms and refusals, the
embedded server's precisions (and its two-stage "coarse+bf16" dtypes), the attestation
rules and `niah doctor`. A row (`Form`) says:

- name: the index dtype as users write it ("fp8");
- key_bytes(d): bytes one stored key of head dim d takes (per kv head, scales included);
- layout: group size and scale layout, in words; group: values sharing one scale (None:
  no scale);
- roundtrip: the reference store round trip, keys [..., D] float -> the keys as the indexer
  reads them back, fp32 (a callable, or "module:function" resolved when first used, so
  that reading the table imports no torch);
- query: the reference quantiser of the index query when the query is in this form (None:
  not a query form); `query_differs` says whether it differs from the keys' round trip
  (fp4: ties go to the even code on the query side);
- engines: where these keys are served: "cpu" (the embedded server's DSA emulation),
  "cuda" (the embedded server on niah's kernels), "external" (a label an external
  server's configuration may state);
- sglang_kernels: the kernels an SGLang arm of these keys runs on ("stock": SGLang's own,
  "niah": niah's plugin); empty when SGLang serves no such arm; sglang_flag / sglang_field:
  SGLang's own switch (and its ServerArgs field) that turns the form on in a stock arm;
- coarse: the form may be the first stage of two-stage selection ("fp8+bf16": the coarse
  form scores every key, its best candidates are re-scored from RESCORE rows);
- proof: what an attestation must show beyond the label (niah.attestation.rules):
  "niah-keys" (every key path ran niah's kernels on these keys, which were stored and read
  during the sweep, the pool holds their rows), "niah-reads" (with kernels "niah": niah's
  logits kernels read these keys during the sweep), or None (the label and, for a stock
  SGLang arm, its sglang_field as SGLang reports it).

`register_form(form)` adds a row (at the end of the order) and returns a handle that, used
as a context manager, removes it again. Pure data: imports nothing of niah, and no torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Union

Quantiser = Union[Callable, str]

CPU, CUDA, EXTERNAL = "cpu", "cuda", "external"
ENGINES = (CPU, CUDA, EXTERNAL)
STOCK, NIAH = "stock", "niah"
PROOFS = ("niah-keys", "niah-reads")
DEFAULT = "fp8"          # the index dtype SGLang (and niah's launchers) run when none is said
RESCORE = "bf16"         # the second stage of a two-stage dtype
TWO_STAGE_SEP = "+"


@dataclass(frozen=True)
class Form:
    name: str
    key_bytes: Callable[[int], int]
    layout: str
    roundtrip: Quantiser
    group: int | None = None
    query: Quantiser | None = None
    engines: tuple[str, ...] = ()
    sglang_kernels: tuple[str, ...] = ()
    sglang_flag: str | None = None
    sglang_field: str | None = None
    coarse: bool = False
    proof: str | None = None

    def __post_init__(self):
        if not self.name or TWO_STAGE_SEP in self.name:
            raise ValueError(f"a form's name is non-empty and has no {TWO_STAGE_SEP!r}: {self.name!r}")
        if set(self.engines) - set(ENGINES) or set(self.sglang_kernels) - {STOCK, NIAH}:
            raise ValueError(f"form {self.name}: engines are {ENGINES}, SGLang kernels stock / niah")
        if self.proof is not None and self.proof not in PROOFS:
            raise ValueError(f"form {self.name}: proof is one of {PROOFS} or None, not {self.proof!r}")

    def store_roundtrip(self, k):
        """Keys [..., D] -> the keys as the indexer reads them back from this form, fp32."""
        return _resolve(self.roundtrip)(k)

    def quantize_query(self, q):
        """An index query [..., D] quantised to this form (per token and head), fp32."""
        if self.query is None:
            raise ValueError(f"{self.name} is not an index-query form")
        return _resolve(self.query)(q)

    @property
    def query_differs(self) -> bool:
        return self.query is not None and self.query != self.roundtrip


def _resolve(fn: Quantiser) -> Callable:
    if callable(fn):
        return fn
    module, _, name = fn.partition(":")
    return getattr(importlib.import_module(module), name)


_Q = "niah.kernels.quant:"
_FORMS: dict[str, Form] = {f.name: f for f in (
    Form("fp8", lambda d: d + 4, "e4m3 values, one fp32 scale a token over the whole key (SGLang / DeepGEMM)",
         _Q + "roundtrip_fp8", group=None, query=_Q + "roundtrip_fp8", engines=(CPU, CUDA, EXTERNAL),
         sglang_kernels=(STOCK, NIAH), coarse=True, proof="niah-reads"),
    Form("fp4", lambda d: d // 2 + d // 32, "MXFP4: e2m1 codes two a byte, one ue8m0 exponent byte a group of 32 "
         "(SGLang's DeepSeek-V4 fp4 indexer)", _Q + "roundtrip_fp4", group=32, query=_Q + "roundtrip_fp4_rne",
         engines=(CPU,), sglang_kernels=(STOCK,), sglang_flag="--enable-deepseek-v4-fp4-indexer",
         sglang_field="enable_deepseek_v4_fp4_indexer", coarse=True),
    Form("bf16", lambda d: 2 * d, "bf16 values, no scale (niah's)", _Q + "roundtrip_bf16",
         query=_Q + "roundtrip_bf16", engines=(CPU, CUDA, EXTERNAL), sglang_kernels=(NIAH,), proof="niah-keys"),
    Form("fp32", lambda d: 4 * d, "fp32 values, exact", _Q + "roundtrip_fp32", query=_Q + "roundtrip_fp32",
         engines=(CPU, CUDA, EXTERNAL)),
)}


def forms() -> tuple[Form, ...]:
    """Every form, in the table's order (registered ones last)."""
    return tuple(_FORMS.values())


def get(name: str) -> Form | None:
    return _FORMS.get(name)


def names(engine: str | None = None) -> tuple[str, ...]:
    """The forms' names (those served by `engine`: "cpu", "cuda", "external")."""
    return tuple(f.name for f in _FORMS.values() if engine is None or engine in f.engines)


def query_names() -> tuple[str, ...]:
    """The index-query forms, widest first (exact fp32, the embedded server's default, leads)."""
    return tuple(f.name for f in sorted((f for f in _FORMS.values() if f.query is not None),
                                        key=lambda f: -f.key_bytes(128)))


def two_stage_names() -> tuple[str, ...]:
    """The two-stage dtypes: "<coarse>+bf16" for every coarse form served on the CPU."""
    return tuple(f"{f.name}{TWO_STAGE_SEP}{RESCORE}" for f in _FORMS.values() if f.coarse and CPU in f.engines)


def sglang_arm_names() -> tuple[str, ...]:
    """The index dtypes of the SGLang arms niah makes (stock or niah kernels)."""
    return tuple(f.name for f in _FORMS.values() if f.sglang_kernels)


def sglang_plugin_names() -> tuple[str, ...]:
    """The index dtypes niah's SGLang plugin holds a pool of (those with an arm on niah's kernels)."""
    return tuple(f.name for f in _FORMS.values() if NIAH in f.sglang_kernels)


def default_kernels(name: str) -> str:
    """The kernels an SGLang arm of `name` runs when none are said: stock where SGLang serves it."""
    form = _FORMS.get(name)
    return NIAH if form is not None and form.sglang_kernels == (NIAH,) else STOCK


def store_roundtrip(k, name: str):
    """Keys [..., D] as the indexer reads them back from form `name`, fp32 (ValueError: unknown)."""
    form = _FORMS.get(name)
    if form is None:
        raise ValueError(f"unknown index dtype {name!r}; expected one of {names()}")
    return form.store_roundtrip(k)


class _Registration:
    def __init__(self, form: Form):
        self.form = form

    def __enter__(self) -> Form:
        return self.form

    def __exit__(self, *exc) -> None:
        unregister_form(self.form.name)


def register_form(form: Form) -> _Registration:
    """Add `form` to the table (ValueError if its name is taken). `with register_form(f):`
    removes it again when the block ends."""
    if form.name in _FORMS:
        raise ValueError(f"index-key form {form.name!r} is already registered")
    _FORMS[form.name] = form
    return _Registration(form)


def unregister_form(name: str) -> None:
    _FORMS.pop(name, None)

