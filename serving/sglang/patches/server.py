"""The model-independent points: SGLang's plugin loading, the attestation in /server_info
and SGLang's own DSA top-k (counted in every arm). One row per symbol and release: 0.5.16's
scheduler process takes the CP/MoE ranks, answers /server_info itself
(`Scheduler.get_internal_state`, no internal-state controller) and its top-k has no
`should_use_topk_v2` (topk_v2 is chosen by SGLANG_OPT_USE_TOPK_V2 inside topk_func)."""

from __future__ import annotations

from niah.serving.sglang.patches.point import PatchPoint, for_releases, wrap

_DSA = "sglang.srt.layers.attention.dsa"

_V0523: tuple[PatchPoint, ...] = (
    # -- plugin loading: SGLang runs entry-point plugins in every process it spawns.
    PatchPoint("sglang.srt.plugins", "load_plugins", (), "uses", "always",
               "SGLang's entry-point plugin loader (group sglang.srt.plugins)",
               ("load_plugins_by_group", "GENERAL_PLUGINS_GROUP")),
    PatchPoint("sglang.srt.managers.scheduler", "run_scheduler_process",
               ("server_args", "port_args", "gpu_id", "tp_rank", "pp_rank", "dp_rank",
                "pipe_writer", "display_tp_rank", "display_dp_rank", "display_moe_ep_rank"),
               "uses", "always", "scheduler (model) processes load plugins before the model",
               ("load_plugins",)),
    # -- attestation: /server_info carries each DP scheduler's internal state.
    PatchPoint("sglang.srt.managers.scheduler_components.internal_state",
               "SchedulerInternalStateController.get_internal_state", ("self", "recv_req"), "wrap", "always",
               "/server_info internal_states: niah adds its attestation (niah_attestation)",
               ("GetInternalStateReqOutput", "msgspec_to_builtins"),
               replacements=(wrap("always", "replacements.wrap_internal_state"),)),
    PatchPoint("sglang.srt.entrypoints.http_server", "server_info", None, "uses", "always",
               "/server_info returns the schedulers' internal states", ("internal_states", "get_internal_state")),
    # -- top-k: SGLang's own in every arm (fused topk_v2 by default), each call counted.
    PatchPoint(f"{_DSA}.dsa_topk_backend", "DSATopKBackend.topk_transform",
               ("self", "logits", "lengths", "topk", "topk_transform_method", "attn_metadata",
                "cu_seqlens_q_topk", "topk_indices_offset", "row_starts", "batch_idx_list", "force_unfused_topk"),
               "wrap", "always", "every DSA top-k goes through it (SGLANG_DSA_FUSE_TOPK: topk_v2); niah counts calls",
               ("SGLANG_DSA_FUSE_TOPK", "topk_func", "should_use_topk_v2"),
               replacements=(wrap("always", "replacements.wrap_topk_transform"),)),
)

_NEW, _OLD = ("0.5.23",), ("0.5.16",)
_BY_NAME = {p.qualname: p for p in _V0523}
_CHANGED = {
    "run_scheduler_process": dict(params=(
        "server_args", "port_args", "gpu_id", "tp_rank", "attn_cp_rank", "moe_dp_rank", "moe_ep_rank", "pp_rank",
        "dp_rank", "pipe_writer", "display_tp_rank", "display_dp_rank", "display_moe_ep_rank")),
    "SchedulerInternalStateController.get_internal_state": dict(
        module="sglang.srt.managers.scheduler", qualname="Scheduler.get_internal_state"),
    "DSATopKBackend.topk_transform": dict(references=("SGLANG_DSA_FUSE_TOPK", "topk_func")),
}

SERVER_POINTS: tuple[PatchPoint, ...] = (
    *(for_releases(_NEW, p) if p.qualname in _CHANGED else p for p in _V0523),
    *(for_releases(_OLD, _BY_NAME[q], **changes) for q, changes in _CHANGED.items()),
)
