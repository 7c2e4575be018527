"""Ragged (prefill) index logits over fp4 keys: the Triton kernel against the float64 torch
reference over the dequantised keys (and query), bf16 and MXFP4 queries, packed sequences.
Metric: calc_diff < 1e-9 (exact values, fp32 accumulation), masks identical with clean_logits.
TRITON_INTERPRET=1 without a GPU (tests/kernels/conftest.py): tiny shapes."""

import pytest
import torch

from niah.kernels import fp4_mqa_logits
from niah.kernels._common import compare_logits
from niah.kernels.fp4_mqa_logits.reference import ref_fp4_mqa_logits
from niah.kernels.quant import fp4_sglang_layout, quantize_fp4

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def ragged(seq_lens, prefix_lens):
    ks, ke, base = [], [], 0
    for n, p in zip(seq_lens, prefix_lens):
        for t in range(n):
            ks.append(base)
            ke.append(base + p + t + 1)
        base += p + n
    return torch.tensor(ks, dtype=torch.int32), torch.tensor(ke, dtype=torch.int32), base


def make_case(q_kind, heads, seq_lens, prefix_lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    ks, ke, skv = ragged(seq_lens, prefix_lens)
    keys = torch.randn(skv, 128, generator=g) * (1 + 3 * torch.rand(skv, 1, generator=g))
    kv = fp4_sglang_layout(*quantize_fp4(keys))  # SGLang's (int8 [Skv, 64], int32 [Skv])
    q = torch.randn(ks.numel(), heads, 128, generator=g)
    if q_kind == "fp4":
        codes, exps = quantize_fp4(q)  # uint8 [S, H, 64], [S, H, 4]
        q = (codes, exps)
    else:
        q = q.bfloat16()
    return q, kv, torch.rand(ks.numel(), heads, generator=g), ks, ke


def _dev(x):
    return tuple(t.to(DEV) for t in x) if isinstance(x, tuple) else x.to(DEV)


@pytest.mark.parametrize("q_kind, clean, seqs, prefixes", [
    ("bf16", True, [5, 3], [0, 60]),
    ("fp4", False, [6], [70]),
], ids=["bf16q-two-seqs-clean", "fp4q-prefix-noclean"])
def test_fp4_mqa_logits_match_float64_reference(q_kind, clean, seqs, prefixes):
    q, kv, w, ks, ke = make_case(q_kind, 16, seqs, prefixes)
    out = fp4_mqa_logits(_dev(q), _dev(kv), w.to(DEV), ks.to(DEV), ke.to(DEV), clean_logits=clean)
    ref = ref_fp4_mqa_logits(q, kv, w, ks, ke)
    diff, masks_equal = compare_logits(out.cpu(), ref)
    assert diff < 1e-9, f"calc_diff {diff:.3e}"
    if clean:
        assert masks_equal


def test_bad_inputs_raise_clear_errors():
    q, kv, w, ks, ke = make_case("bf16", 16, [3], [10])
    with pytest.raises(ValueError, match="compressed"):
        fp4_mqa_logits(q, kv, w, ks, ke, clean_logits=False, max_seqlen_k=8)
    with pytest.raises(ValueError, match="kv must be MXFP4 keys"):
        fp4_mqa_logits(q, q[:, 0], w, ks, ke)
    with pytest.raises(ValueError, match="cu_seq_len_k_start must be int32"):
        fp4_mqa_logits(q, kv, w, ks.long(), ke)
