"""CUDA-graph replays are counted (serving/sglang/attest.py): a recorded call captured into
a real CUDA graph counts once as `captured`, and every replay counts itself on the GPU;
an eager call launches no GPU work. Needs a CUDA device (marker gpu); the capture branch
itself is also exercised on CPU in test_sglang_attestation.py."""

from __future__ import annotations

import pytest
import torch

from niah.serving.sglang import attest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

REPLAYS = 37


@pytest.fixture()
def fresh_counter():
    attest.reset()
    yield
    attest.reset()


def test_replays_of_a_captured_call_are_counted_on_the_device(fresh_counter):
    attest.configure("bf16", "niah")
    x = torch.zeros(8, device="cuda")

    def step():  # a patched path: record, then its kernel
        attest.record("decode_logits", "bf16", "niah.bf16_paged_mqa_logits")
        x.add_(1)

    step()  # eager: allocates this device's replay counter, once
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as PyTorch's docs capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
        step()  # two calls in the graph (two layers, say)
    for _ in range(REPLAYS):
        graph.replay()
    torch.cuda.synchronize()
    snap = attest.snapshot()
    assert snap["calls"]["decode_logits"]["bf16"]["niah.bf16_paged_mqa_logits"] == {
        "eager": 2, "captured": 2, "replayed": 2 * REPLAYS}
    assert snap["counts"] == {"decode_logits.bf16": 2 + 2 * REPLAYS}  # what ran: eager + replayed
    assert snap["replay_counters"] == 1
    assert x[0].item() == 2 + 2 * REPLAYS  # the graph's kernels ran as often as counted


def test_an_eager_record_launches_no_gpu_work(fresh_counter):
    from torch.profiler import ProfilerActivity, profile

    attest.record("store", "bf16", "niah.store_index_keys")  # the one-time counter allocation
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            attest.record("store", "bf16", "niah.store_index_keys")
        torch.cuda.synchronize()
    gpu = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert gpu == []
    assert attest.snapshot()["calls"]["store"]["bf16"]["niah.store_index_keys"]["eager"] == 11
