"""Paged index logits (decode) over fp4 (MXFP4) key pages: fp4_paged_mqa_logits. Imports triton only when called."""

from niah.kernels.fp4_paged_logits.wrapper import fp4_paged_mqa_logits  # noqa: F401
