"""The embedded indexer's precisions: index keys, the index query, and two-stage selection.

Index keys (`index_dtype`), as the CPU DSA emulation (dsa.py) stores them:
- "fp8", "fp4", "bf16", "fp32": one stored form (niah.kernels.quant.store_roundtrip; fp4 is
  SGLang 0.5.23's MXFP4 index key: groups of 32 values, one ue8m0 exponent each, e2m1
  codes, its C4 pools' tie rule, two codes a byte);
- "fp8+bf16", "fp4+bf16": two-stage selection. The store keeps BOTH forms of every key (the
  fp8 or fp4 row with its scale(s), and the bf16 row); the indexer scores every causal key
  from the coarse (fp8 / fp4) form,
  keeps the c*k best as candidates (c = `rescore_factor`; keys whose coarse score is a ReLU
  tie at 0 rank below every scoring key and among themselves by their largest coarse head
  product, selection.candidate_order), re-scores only those candidates
  from their bf16 rows (gathered by index: no full bf16 read), and selects the k best of
  the re-scored candidates. With c*k >= the context every key is a candidate and the
  selection is bf16's.

Bytes a token and layer of the stored index keys (`key_bytes`, per kv head, summed over
the kv heads): fp8 D + 4 (values + one fp32 scale), fp4 D/2 + D/32 (codes + one exponent
byte a group of 32), bf16 2D, fp32 4D; a two-stage dtype the sum of its two forms. A decode
step of a two-stage arm reads the coarse form of every key plus c*k bf16 rows (`read_bytes`).

Index query (`index_query_dtype`), what the index query is quantised to before its dot
products with the keys (after the rotation, when there is one):
- "fp32": the layer's own query, unquantised (the embedded server's default);
- "bf16": rounded to bf16;
- "fp8": as SGLang's fused V3.2 indexer query (`fused_q_indexer_rope_first_quant`): per
  token and head, one fp32 scale amax / 448 over the head's D values, e4m3 values
  (niah.kernels.quant.quantize_fp8). The scale is positive, so folding it into the head
  weights (SGLang) and multiplying it back here are the same arithmetic up to fp32 rounding;
- "fp4": MXFP4 as the keys (niah.kernels.quant.quantize_fp4), ties to the even code (the
  rule SGLang's fp4 query path uses).
The emulation computes in fp32 on the values as quantised (dequantised on read), exactly
as it treats the keys (selection.py). The forms, their bytes and quantisers are the
table's (niah.kernels.forms): a form served on "cpu" is an index dtype here, a "coarse" one
also makes "<form>+bf16", a query form an index query dtype; the lists below are read from
the table when called. Pure data and arithmetic: the CLI and the matrix loader read it
without torch.
"""

from __future__ import annotations

from niah.kernels import forms

DEFAULT_QUERY_DTYPE = "fp32"
DEFAULT_RESCORE_FACTOR = 4


def single_dtypes() -> tuple[str, ...]:
    """The stored forms the CPU emulation serves ("fp8", "fp4", "bf16", "fp32")."""
    return forms.names(forms.CPU)


def two_stage_dtypes() -> tuple[str, ...]:
    """The two-stage dtypes ("fp8+bf16", "fp4+bf16")."""
    return forms.two_stage_names()


def index_dtypes() -> tuple[str, ...]:
    """Every index dtype the embedded server takes: the single forms, then the two-stage ones."""
    return single_dtypes() + two_stage_dtypes()


def query_dtypes() -> tuple[str, ...]:
    """The index query's precisions ("fp32", "bf16", "fp8", "fp4")."""
    return forms.query_names()


def stages(index_dtype: str) -> tuple[str, str | None]:
    """(coarse form, re-score form or None): "fp8+bf16" -> ("fp8", "bf16"), "fp8" -> ("fp8", None)."""
    if index_dtype not in index_dtypes():
        raise ValueError(f"index dtype must be one of {', '.join(index_dtypes())}, not {index_dtype!r}")
    coarse, _, fine = index_dtype.partition(forms.TWO_STAGE_SEP)
    return coarse, fine or None


def _form_bytes(form: str, dim: int) -> int:
    return forms.get(form).key_bytes(dim)


def key_bytes(index_dtype: str, n_kv: int, dim: int) -> int:
    """Bytes a token and layer of the stored index keys (both forms for a two-stage dtype)."""
    return n_kv * sum(_form_bytes(f, dim) for f in stages(index_dtype) if f is not None)


def read_bytes(index_dtype: str, n_kv: int, dim: int, context: int, topk: int, factor: int) -> int:
    """Index-key bytes one decode step of one layer reads over `context` tokens: every key's
    coarse form, plus (two-stage) the bf16 rows of its min(c*k, context) candidates."""
    coarse, fine = stages(index_dtype)
    out = context * n_kv * _form_bytes(coarse, dim)
    if fine is not None:
        out += min(factor * topk, context) * n_kv * _form_bytes(fine, dim)
    return out
