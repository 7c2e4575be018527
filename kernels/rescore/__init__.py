"""Two-stage selection's re-score: bf16_paged_rescore (the candidates' bf16 rows gathered
by index and scored), fp8_bf16_two_stage_topk (fp8 logits, candidates, re-score, top-k) and
fp4_bf16_two_stage_topk (the same from fp4 logits).
Imports triton only when called."""

from niah.kernels.rescore.wrapper import (  # noqa: F401
    bf16_paged_rescore,
    fp4_bf16_two_stage_topk,
    fp8_bf16_two_stage_topk,
)
