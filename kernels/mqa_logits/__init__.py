"""Ragged (prefill) index logits: fp8_mqa_logits, bf16_mqa_logits. Imports triton only when called."""

from niah.kernels.mqa_logits.wrapper import bf16_mqa_logits, fp8_mqa_logits  # noqa: F401
