"""Paged index logits (decode): fp8_paged_mqa_logits, bf16_paged_mqa_logits, and the
DeepGEMM-compatible get_paged_mqa_logits_metadata. Imports triton only when called."""

from niah.kernels.paged_logits.wrapper import (  # noqa: F401
    bf16_paged_mqa_logits,
    fp8_paged_mqa_logits,
    get_paged_mqa_logits_metadata,
)
