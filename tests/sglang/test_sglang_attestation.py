"""Attestation: the counter the plugin and the embedded server keep (eager, CUDA-graph
captured and replayed calls), and the rules that judge a configuration from its server's
readings at the start and end of its sweep (niah/attestation/rules.py). The refusals end
to end, against real loopback servers, are in test_attestation_proof.py."""

from __future__ import annotations

import types

import pytest
import torch

from niah.attestation import INVALID, UNATTESTED, VALID, from_server_info, reading_of, status
from niah.serving.sglang import attest


@pytest.fixture()
def fresh_counter():
    attest.reset()
    yield
    attest.reset()


# -- the counter ---------------------------------------------------------------------------
def test_counter_flags_fp8_paths_reached_while_bf16_is_configured(fresh_counter):
    from niah.serving.sglang import replacements

    attest.configure("bf16", "niah")
    buf = torch.zeros(2, 64 * 256, dtype=torch.uint8)
    replacements.store_bf16_keys(buf, torch.arange(3), torch.randn(3, 128), use_kernel=False)
    with pytest.raises(RuntimeError, match="store_quantized"):
        replacements.index_key_cache_store_quantized(None, 0, None, None, None)
    snap = attest.snapshot()
    assert snap["counts"] == {"store.bf16": 1, "store.fp8": 1} and snap["fp8_reads_while_bf16"] == 1
    assert snap["calls"]["store"] == {
        "bf16": {"niah.store_keys_torch": {"eager": 1, "captured": 0, "replayed": 0}},
        "fp8": {"sglang.IndexKeyCache.store_quantized": {"eager": 1, "captured": 0, "replayed": 0}}}
    assert snap["replay_counters"] == 0  # no CUDA in this process: no device counter, no GPU op
    with pytest.raises(ValueError, match="unknown path"):
        attest.record("logits", "bf16", "niah.x")
    with pytest.raises(ValueError, match="owner"):
        attest.record("store", "bf16", "mykernel")


def test_a_captured_call_leaves_an_increment_that_each_replay_counts(fresh_counter):
    """The capture branch of attest.record on a real tensor. On CPU the increment runs at
    once (inside a CUDA capture it is only recorded: the GPU test replays a real graph);
    snapshot() reads the slots back as replays, apart from eager and captured calls."""
    counter = attest.ReplayCounter("cpu")
    key = ("decode_logits", "bf16", "niah.bf16_paged_mqa_logits")
    attest.record(*key)                       # eager
    attest.record_captured(key, counter)      # captured: one node `slots[i] += 1`
    attest.record_captured(("topk", "fp32", "sglang.topk_v2"), counter)
    assert counter.slots.tolist()[:3] == [1, 1, 0]
    attest._counters["cpu"] = counter         # what record() keeps per CUDA device
    counter.slots.zero_()
    for _ in range(5):                        # five replays of the graph
        counter.count(0)
        counter.count(1)
    snap = attest.snapshot()
    assert snap["calls"]["decode_logits"]["bf16"]["niah.bf16_paged_mqa_logits"] == {
        "eager": 1, "captured": 1, "replayed": 5}
    assert snap["counts"] == {"decode_logits.bf16": 6, "topk.fp32": 5}  # what ran: eager + replayed
    assert snap["kernel_calls"]["topk"] == {"sglang.topk_v2": 5} and snap["replay_counters"] == 1
    with pytest.raises(RuntimeError, match="before any eager call"):
        attest.record_captured(key, None)


def test_a_tallied_graph_takes_one_node_and_counts_its_whole_tally_each_replay(fresh_counter):
    """graph_tally (the embedded server's decode graphs): the calls recorded inside it are
    captured and tallied, no per-call slot is used, and the graph gets one node (on CPU it
    runs at once, as inside a capture it would be recorded); each replay of that node counts
    the whole tally. A graph that records nothing takes no slot; tallies do not nest; a
    graph that records a call without a counter is refused."""
    counter = attest.ReplayCounter("cpu")
    attest._counters["cpu"] = counter
    store, topk = ("store", "fp8", "niah.store_index_keys"), ("topk", "fp32", "niah.topk_indices")
    attest.record(*topk)                                  # eager, outside any graph
    with attest.graph_tally(counter) as tally:            # one decode graph: 2 layers x (store, topk)
        for _ in range(2):
            attest.record(*store)
            attest.record(*topk)
    assert dict(tally) == {store: 2, topk: 2}
    assert counter.slots.tolist() == [0] * attest.ReplayCounter.SLOTS      # no per-call node
    assert counter.read_graphs() == [1]                   # its one node
    counter.graphs.zero_()
    with attest.graph_tally(counter):                     # a dense graph: nothing recorded, no slot
        pass
    assert counter.n_graphs == 1
    for _ in range(7):                                    # seven replays
        counter.count_graph(0)
    snap = attest.snapshot()
    assert snap["calls"]["store"]["fp8"]["niah.store_index_keys"] == {"eager": 0, "captured": 2, "replayed": 14}
    assert snap["calls"]["topk"]["fp32"]["niah.topk_indices"] == {"eager": 1, "captured": 2, "replayed": 14}
    with pytest.raises(RuntimeError, match="nest"), attest.graph_tally(counter), attest.graph_tally(counter):
        pass
    with pytest.raises(RuntimeError, match="before any eager call"), attest.graph_tally(None):
        attest.record(*store)
    attest.record(*store)                                 # every tally closed: eager again
    assert attest.snapshot()["calls"]["store"]["fp8"]["niah.store_index_keys"]["eager"] == 1


def test_stock_counters_pass_calls_through_and_attestation_reaches_internal_state(fresh_counter):
    from niah.serving.sglang import replacements

    attest.configure("fp8", "niah")
    resolver = replacements.counting("decode_logits", "fp8", "sglang.resolve_fp8_paged_mqa_logits_fn")(
        lambda: "deep_gemm.fp8_paged_mqa_logits")
    assert resolver() == "deep_gemm.fp8_paged_mqa_logits" and resolver() == "deep_gemm.fp8_paged_mqa_logits"
    controller_out = types.SimpleNamespace(internal_state={"tp_size": 8})
    get_state = replacements.wrap_internal_state(lambda self, req: controller_out)
    state = get_state(None, None).internal_state
    assert state["tp_size"] == 8
    assert state["niah_attestation"]["counts"] == {"decode_logits.fp8": 2}
    reading = reading_of({"internal_states": [state]})
    assert reading["internal_states"] == reading["attested_states"] == 1
    assert reading["attestation"]["kernel_calls"] == {"decode_logits": {"sglang.resolve_fp8_paged_mqa_logits_fn": 2}}


@pytest.mark.parametrize("release, module", [("0.5.16", "sglang.srt.managers.io_struct"),
                                             ("0.5.23", "sglang.srt.utils.msgpack_utils")])
def test_the_attestation_crosses_each_releases_scheduler_ipc_unchanged(fresh_counter, release, module):
    """The wrapped get_internal_state's dict goes from each scheduler to the tokenizer manager
    through msgspec's msgpack encoder with SGLang's own enc_hook (lifted from the release's
    wheel; it refuses what is not msgpack-native): the attestation arrives as it was."""
    import json
    from array import array

    import msgspec
    import numpy as np

    from niah.serving.sglang import replacements
    from sglang_source import load_function, sglang_wheel

    enc_hook = load_function(sglang_wheel(release), module, "enc_hook", {"array": array, "torch": torch, "np": np})
    attest.configure("bf16", "niah")
    replacements.counting("decode_logits", "bf16", "niah.bf16_paged_mqa_logits")(lambda: None)()
    out = types.SimpleNamespace(internal_state={"tp_size": 8})
    state = replacements.wrap_internal_state(lambda self, req: out)(None, None).internal_state
    back = msgspec.msgpack.decode(msgspec.msgpack.Encoder(enc_hook=enc_hook).encode(state))
    assert back == json.loads(json.dumps(state))
    reading = reading_of({"internal_states": [back]})
    assert reading["attested_states"] == 1 and reading["attestation"]["counts"] == {"decode_logits.bf16": 1}


def test_server_info_of_several_schedulers_is_summed():
    a = _att("bf16", "niah", _calls(store=("bf16", "niah.store_index_keys", 40)), pool=256)
    b = _att("bf16", "niah", _calls(store=("bf16", "niah.store_index_keys", 2)), pool=132)
    got = from_server_info({"internal_states": [{"niah_attestation": a}, {"niah_attestation": b}, {"x": 1}]})
    assert got["schedulers"] == 2 and got["counts"] == {"store.bf16": 42}
    assert got["disagree"] == ["pool_bytes_per_token"]
    assert from_server_info({"version": "0.5.23"}) is None and from_server_info(None) is None
    r = reading_of({"internal_states": [{"niah_attestation": a}, {"x": 1}]})
    assert (r["internal_states"], r["attested_states"]) == (2, 1)


def test_embedded_indexer_attests_what_it_stored(fresh_counter):
    from niah.serving.embedded.dsa import DSA, attestation
    from niah.serving.embedded.model import LayerCache

    assert attestation() is None  # nothing configured
    for dtype in ("bf16", "fp8"):
        attest.reset()
        dsa = DSA(dtype, topk=4, dense_when_short=False)
        cache = LayerCache(k=torch.zeros(1, 3, 16, 64), v=torch.zeros(1, 3, 16, 64), idx_k=torch.zeros(3, 16, 64))
        start = reading_of({"niah_attestation": attestation()})
        dsa.store(cache, torch.randn(1, 3, 8, 64), 0)
        dsa.keep_mask(torch.randn(1, 9, 8, 64), cache.idx_k[:, :8], 0)
        a = attestation()
        assert a["counts"] == {f"store.{dtype}": 1, f"prefill_logits.{dtype}": 1, "topk.fp32": 1}
        assert a["pool_bytes_per_token"] == 3 * (128 if dtype == "bf16" else 68)
        assert a["facts"] == {"attention": "dsa", "index_topk": 4, "window": 0, "rotation": "none", "query": "fp32"}
        end = reading_of({"niah_attestation": a})
        entry = _entry("embedded", {"attention": "dsa", "index_dtype": dtype, "index_topk": 4}, start, end)
        assert status(entry) == (VALID, f"{dtype}/torch, {a['pool_bytes_per_token']} B/token; during the sweep: "
                                 f"store +1 (niah.store_roundtrip); prefill_logits +1 (niah.embedded_index_scores); "
                                 "topk +1 (torch.topk)")
        other = "bf16" if dtype == "fp8" else "fp8"
        assert status({**entry, "settings": {"index_dtype": other}}) == (
            INVALID, f"labelled index_dtype {other} but the server ran {dtype}")
        assert status({**entry, "settings": {"index_topk": 64}}) == (
            INVALID, "labelled index_topk 64 but the server ran 4")


# -- the rules ----------------------------------------------------------------------------------
def _calls(**paths) -> dict:
    """_calls(store=("bf16", "niah.k", n), ...) -> a snapshot's `calls` (n eager calls)."""
    out: dict = {}
    for path, specs in paths.items():
        for dtype, kernel, n in (specs if isinstance(specs, list) else [specs]):
            out.setdefault(path, {}).setdefault(dtype, {})[kernel] = {"eager": n, "captured": 0, "replayed": 0}
    return out


def _att(dtype, kernels, calls, pool=None, facts=None) -> dict:
    return {"index_dtype": dtype, "kernels": kernels, "pool_bytes_per_token": pool, "facts": facts or {},
            "calls": calls}


def _sglang(*atts, states: int = 1) -> dict:
    """A reading of SGLang's /server_info whose first len(atts) schedulers report `atts`[0]."""
    return reading_of({"version": "0.5.23", "internal_states": [
        {"niah_attestation": atts[0]} if i < len(atts) else {"dp_rank": i} for i in range(states)]})


def _entry(engine, label, start, end, **extra) -> dict:
    return {"engine": engine, "settings": label, "attestation": {"segments": [{"start": start, "end": end}]}, **extra}


BF16_START = _att("bf16", "niah", _calls(store=("bf16", "niah.store_index_keys", 3),
                                         decode_logits=("bf16", "niah.bf16_paged_mqa_logits", 2)), pool=256)
BF16_END = _att("bf16", "niah", _calls(store=("bf16", "niah.store_index_keys", 90),
                                       decode_logits=("bf16", "niah.bf16_paged_mqa_logits", 700),
                                       prefill_logits=("bf16", "niah.bf16_mqa_logits", 30)), pool=256)


def test_bf16_arm_must_store_and_read_bf16_with_niah_kernels_during_the_sweep():
    bf16 = {"index_dtype": "bf16"}
    ok = status(_entry("sglang", bf16, _sglang(BF16_START), _sglang(BF16_END)))
    assert ok == (VALID, "bf16/niah, 256 B/token; during the sweep: store +87 (niah.store_index_keys); "
                         "prefill_logits +30 (niah.bf16_mqa_logits); decode_logits +698 (niah.bf16_paged_mqa_logits)")
    # warm-up stored keys before the start reading and nothing more happened: not proven
    assert status(_entry("sglang", bf16, _sglang(BF16_START), _sglang(BF16_START))) == (
        INVALID, "bf16 configured but no bf16 key was stored during the sweep")
    stored_only = _att("bf16", "niah", _calls(store=("bf16", "niah.store_index_keys", 90),
                                              decode_logits=("bf16", "niah.bf16_paged_mqa_logits", 2)), pool=256)
    assert status(_entry("sglang", bf16, _sglang(BF16_START), _sglang(stored_only))) == (
        INVALID, "no bf16 index-key read during the sweep (decode/prefill logits: 2 before, none more after; "
                 "a store at warm-up does not count)")
    # V4's bf16 row is 264 B/token; an fp8-sized pool is not bf16
    v4 = {**BF16_END, "pool_bytes_per_token": 264}
    assert status(_entry("sglang", bf16, _sglang({**BF16_START, "pool_bytes_per_token": 264}), _sglang(v4)))[0] == VALID
    small = {**BF16_END, "pool_bytes_per_token": 132}
    assert status(_entry("sglang", bf16, _sglang({**BF16_START, "pool_bytes_per_token": 132}), _sglang(small))) == (
        INVALID, "bf16 configured but the pool holds 132 B/token/layer, not a bf16 row (256 on V3.2, 264 on V4)")
    # any fp8 path, even one only captured into a CUDA graph, and SGLang's own store
    fp8 = {**BF16_END, "calls": {**BF16_END["calls"], "prefill_logits": {"fp8": {"niah.fp8_mqa_logits": {
        "eager": 0, "captured": 1, "replayed": 0}}}}}
    assert status(_entry("sglang", bf16, _sglang(BF16_START), _sglang(fp8))) == (
        INVALID, "1 fp8 index-key path call(s) while bf16 was configured")
    sgl0 = {**BF16_START, "calls": {**BF16_START["calls"], **_calls(store=("bf16", "sglang.fused_store", 3))}}
    sgl = {**BF16_END, "calls": {**BF16_END["calls"], **_calls(store=("bf16", "sglang.fused_store", 90))}}
    assert status(_entry("sglang", bf16, _sglang(sgl0), _sglang(sgl))) == (
        INVALID, "bf16 configured but store ran sglang.fused_store on bf16 keys")


def test_fp8_niah_arm_must_show_niahs_logits_kernels():
    lab = {"index_dtype": "fp8", "kernels": "niah"}
    start = _att("fp8", "niah", _calls(decode_logits=("fp8", "niah.fp8_paged_mqa_logits", 1)), pool=132)
    end = _att("fp8", "niah", _calls(decode_logits=("fp8", "niah.fp8_paged_mqa_logits", 50),
                                     prefill_logits=("fp8", "niah.fp8_mqa_logits", 4)), pool=132)
    assert status(_entry("sglang", lab, _sglang(start), _sglang(end)))[0] == VALID
    assert status(_entry("sglang", lab, _sglang(start), _sglang(start))) == (
        INVALID, "labelled kernels niah but niah's fp8 logits kernels did not run during the sweep")
    dg = _att("fp8", "niah", _calls(decode_logits=[("fp8", "niah.fp8_paged_mqa_logits", 50),
                                                   ("fp8", "deep_gemm.fp8_paged_mqa_logits", 9)]), pool=132)
    assert status(_entry("sglang", lab, _sglang(start), _sglang(dg))) == (
        INVALID, "labelled kernels niah but decode_logits ran deep_gemm.fp8_paged_mqa_logits")
    # the label says niah kernels, the server ran bf16 or another arm
    assert status(_entry("sglang", lab, _sglang(BF16_START), _sglang(BF16_END))) == (
        INVALID, "labelled index_dtype fp8 but the server ran bf16")


def test_stock_arm_proves_the_plugin_was_absent():
    absent = _sglang(states=2)
    assert status(_entry("sglang", {}, absent, absent)) == (
        VALID, "SGLang's own paths: niah's plugin absent in all 2 scheduler(s) at start and end "
               "(its kernels are SGLang's, unattested beyond that)")
    ran = _sglang(_att("fp8", "stock", {}), states=2)
    assert status(_entry("sglang", {"index_dtype": "fp8"}, absent, ran)) == (
        INVALID, "niah's plugin ran in the stock arm (1 of 2 scheduler(s) report niah_attestation at the end)")
    not_sglang = reading_of({"engine": "oracle"})
    assert status(_entry("sglang", {}, not_sglang, not_sglang))[1].startswith(
        "/server_info at the start has no internal_states: not SGLang's")


def test_a_niah_arm_needs_the_attestation_in_every_scheduler_and_a_steady_counter():
    bf16 = {"index_dtype": "bf16"}
    assert status(_entry("sglang", bf16, _sglang(states=2), _sglang(states=2))) == (
        INVALID, "no niah_attestation in /server_info at the start: niah's plugin did not run in SGLang's "
                 "scheduler processes (SGLANG_PLUGINS set without niah?)")
    assert status(_entry("sglang", bf16, _sglang(BF16_START, states=2), _sglang(BF16_END, states=2))) == (
        INVALID, "niah_attestation in only 1 of 2 SGLang scheduler(s) at the start")
    assert status(_entry("sglang", bf16, _sglang(BF16_END), _sglang(BF16_START))) == (
        INVALID, "its counters went down during the sweep (the server restarted?)")
    fp8 = _att("fp8", "niah", BF16_END["calls"])
    assert status(_entry("sglang", bf16, _sglang(fp8), _sglang(BF16_END))) == (
        INVALID, "the server's arm changed during the sweep (fp8/niah -> bf16/niah)")


def test_launched_configurations_without_readings_are_invalid():
    assert status({"engine": "sglang", "status": "failed to start", "cause": "CUDA out of memory"}) == (
        INVALID, "no attestation was read from its sglang server (failed to start: CUDA out of memory)")
    died = _entry("embedded", {}, _sglang(BF16_START),
                  {"error": "the server died before it was asked: killed by SIGKILL"})
    assert status(died) == (INVALID, "/server_info at the end of the sweep: the server died before it was asked: "
                                     "killed by SIGKILL")
    legacy = {"engine": "sglang", "settings": {"index_dtype": "bf16"},
              "attestation": {"index_dtype": "bf16", "kernels": "niah", "counts": {"store.bf16": 4}}}
    assert status(legacy) == (INVALID, "no /server_info reading at the start of the sweep")


def test_external_labels_are_unattested_unless_their_server_reports_them():
    gone = {"error": "http://x/server_info answered HTTP 404"}
    assert status({"engine": "external", "axes": {}}) == (VALID, "no labels to attest")
    assert status(_entry("external", {"endpoint": "http://x"}, gone, gone)) == (
        VALID, "no labels to attest (/server_info at the end of the sweep: http://x/server_info answered HTTP 404)")
    assert status(_entry("external", {"index_dtype": "bf16"}, gone, gone)) == (
        UNATTESTED, "labels index_dtype=bf16 are not attested: its server reports no niah_attestation "
                    "(/server_info at the end of the sweep: http://x/server_info answered HTTP 404)")
    # an external SGLang with niah's plugin attests index_dtype and kernels, not index_topk
    both = {"index_dtype": "bf16", "index_topk": 512}
    s, reason = status(_entry("external", both, _sglang(BF16_START), _sglang(BF16_END)))
    assert s == UNATTESTED and reason.startswith("labels index_topk=512 are not reported by its server (bf16/niah")
    assert status(_entry("command", {"index_dtype": "fp8"}, _sglang(BF16_START), _sglang(BF16_END))) == (
        INVALID, "labelled index_dtype fp8 but the server ran bf16")
    # reported at the start, gone at the end: what it claimed is not proven
    assert status(_entry("external", {"index_dtype": "bf16"}, _sglang(BF16_START), gone))[0] == INVALID
    # kernels=stock on an SGLang without the plugin
    absent = _sglang(states=1)
    assert status(_entry("external", {"kernels": "stock"}, absent, absent))[0] == VALID
    assert status(_entry("external", {"kernels": "stock", "index_dtype": "fp8"}, absent, absent))[0] == UNATTESTED


def test_segments_are_judged_one_by_one():
    good = {"start": _sglang(BF16_START), "end": _sglang(BF16_END)}
    died = {"start": _sglang(BF16_START), "end": {"error": "the server died before it was asked: exit code 1"}}
    entry = {"engine": "sglang", "settings": {"index_dtype": "bf16"}, "attestation": {"segments": [died, good]}}
    # a segment without an end reading is closed by the resumed sweep's start reading
    assert status(entry)[0] == VALID
    assert status({**entry, "attestation": {"segments": [good, died]}}) == (
        INVALID, "segment 2 of 2: /server_info at the end of the sweep: the server died before it was asked: "
                 "exit code 1")
    assert status({**entry, "attestation": {"segments": [good, good]}})[0] == VALID
