"""Ragged (prefill) index logits over fp4 (MXFP4) keys: fp4_mqa_logits. Imports triton only when called."""

from niah.kernels.fp4_mqa_logits.wrapper import fp4_mqa_logits  # noqa: F401
