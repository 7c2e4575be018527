"""`niah serve` as a real subprocess on loopback, driven by the official `openai` client.

One server for the module: DSA with fp8 index keys, top-k 64 and a 512-token window, so
short prompts run the full indexer path while a ~500-token needle stays visible; one
~800-token request checks that selection recall sees a needle the indexer dropped.
The same server takes malformed bodies and fields (each a 400, never a 500) and clients
that leave mid-decode, mid-prefill and mid-stream (each cancelled, counted in
/server_info, and the next request served with clean caches).
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

TOPK, WINDOW = 64, 512
WORDS = ("the old mill stood by a quiet river where farmers brought apples and barley each autumn "
         "while children watched boats drift past green hills under a pale grey sky").split()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(embedded_server):
    """The run's one server of these flags (tests/conftest.py `embedded_server`: started at its
    first use, stopped by SIGTERM at the end of the run, where it must exit 0)."""
    s = embedded_server("--attention", "dsa", "--index-dtype", "fp8", "--index-topk", TOPK, "--window", WINDOW)
    return {"base": s.base, "client": openai.OpenAI(base_url=s.url, api_key="none", max_retries=0, timeout=300),
            "proc": s.proc, "lines": s.lines}


def _chat(client, content: str, **kw):
    return client.chat.completions.create(model="SmolLM2-135M-Instruct",
                                          messages=[{"role": "user", "content": content}], temperature=0, **kw)


def _tokenize(base: str, body: dict) -> dict:
    r = httpx.post(base + "/tokenize", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_models_health_and_info(server):
    assert httpx.get(server["base"] + "/health").status_code == 200
    models = server["client"].models.list().data
    assert len(models) == 1
    m = models[0].model_dump()
    assert m["id"] == "SmolLM2-135M-Instruct" and m["max_model_len"] == 8192
    assert (m["niah_extensions"] == ["needle_span", "indexer_probe"] and m["attention"] == "dsa"
            and m["index_dtype"] == "fp8")
    info = httpx.get(server["base"] + "/server_info").json()
    assert (info["index_topk"], info["window"], info["max_model_len"]) == (TOPK, WINDOW, 8192)


def test_chat_usage_is_exact(server):
    msgs = [{"role": "user", "content": "Name three colours of the rainbow."}]
    r = server["client"].chat.completions.create(model="x", messages=msgs, max_tokens=6, temperature=0)
    tok = _tokenize(server["base"], {"messages": msgs})
    assert tok["max_model_len"] == 8192 and tok["count"] == len(tok["tokens"])
    assert r.usage.prompt_tokens == tok["count"]
    assert r.choices[0].finish_reason in ("stop", "length")
    if r.choices[0].finish_reason == "length":
        assert r.usage.completion_tokens == 6
    assert 1 <= r.usage.completion_tokens <= 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    # /v1/tokenize is the same thing; a prompt is tokenized without a template
    assert _tokenize(server["base"] + "/v1", {"messages": msgs}) == tok
    plain = _tokenize(server["base"], {"prompt": "Hello world"})
    assert 0 < plain["count"] < tok["count"]


def test_stream_matches_plain_and_reports_usage(server):
    c = server["client"]
    plain = _chat(c, "Write one sentence about the sea.", max_tokens=12)
    chunks = list(_chat(c, "Write one sentence about the sea.", max_tokens=12, stream=True,
                        stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert text == plain.choices[0].message.content
    assert finish == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump(include={"prompt_tokens", "completion_tokens"}) \
        == plain.usage.model_dump(include={"prompt_tokens", "completion_tokens"})
    assert len([ch for ch in chunks if ch.choices and ch.choices[0].delta.content]) >= 2   # really streamed


def test_completions_max_tokens_and_stop(server):
    c = server["client"]
    r = c.completions.create(model="x", prompt="The capital of France is", max_tokens=10, temperature=0)
    text = r.choices[0].text
    assert r.usage.prompt_tokens == _tokenize(server["base"], {"prompt": "The capital of France is"})["count"]
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 10 and len(text) > 3
    stop = text[len(text) // 2: len(text) // 2 + 2]
    s = c.completions.create(model="x", prompt="The capital of France is", max_tokens=10, temperature=0, stop=[stop])
    assert s.choices[0].finish_reason == "stop"
    assert s.choices[0].text == text[: text.find(stop)]
    assert s.usage.completion_tokens < 10
    streamed = c.completions.create(model="x", prompt="The capital of France is", max_tokens=10, temperature=0,
                                    stop=[stop], stream=True)
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == s.choices[0].text


def test_overlong_prompt_is_a_400_and_the_server_keeps_serving(server):
    c = server["client"]
    with pytest.raises(openai.BadRequestError) as e:
        _chat(c, "word " * 9000, max_tokens=4)
    assert e.value.status_code == 400 and "context" in str(e.value)
    n = _tokenize(server["base"], {"messages": [{"role": "user", "content": "Hi"}]})["count"]
    with pytest.raises(openai.BadRequestError):                       # prompt + max_tokens > 8192
        _chat(c, "Hi", max_tokens=8192 - n + 1)
    ok = _chat(c, "Hi", max_tokens=3)
    assert ok.usage.completion_tokens >= 1


def test_max_model_len_caps_the_context_it_reports_and_refuses_past_it(embedded_server):
    from niah.regime import Regime
    from niah.sweep.coverage import field_lengths
    from niah.sweep.server_regime import server_regime

    s = embedded_server("--attention", "dsa", "--index-topk", 128, "--max-model-len", 1024)
    models = httpx.get(s.url + "/models", timeout=30).json()["data"][0]
    assert models["max_model_len"] == 1024
    assert server_regime(s.url, None, None)[1] == 1024                # what a sweep reads as the context
    n = _tokenize(s.base, {"messages": [{"role": "user", "content": "Hi"}]})["count"]
    body = {"model": "x", "messages": [{"role": "user", "content": "Hi"}]}
    r = httpx.post(s.url + "/chat/completions", json={**body, "max_tokens": 1024 - n + 1}, timeout=120)
    assert r.status_code == 400 and "1024" in r.text                 # past the cap: refused, not truncated
    r = httpx.post(s.url + "/chat/completions", json={**body, "max_tokens": 1024 - n}, timeout=300)
    assert r.status_code == 200, r.text                               # up to it: served
    assert max(field_lengths(Regime(128, 1, 0), 1024, 32)) < 1024     # the preset's ceiling follows it


@pytest.mark.parametrize("body, param", [
    ({"model": "x"}, "messages"),
    ({"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({"model": "x", "messages": [{"role": "user", "content": "hi"}], "niah_needle_span": [1, 99]}, "niah_needle_span"),
    ({"model": "x", "messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
])
def test_bad_requests_get_openai_errors(server, body, param):
    r = httpx.post(server["base"] + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    r = httpx.post(server["base"] + "/v1/chat/completions", content=b"{not json", timeout=60)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_concurrent_requests_are_served_safely(server):
    c = server["client"]
    prompts = ["Count to five.", "Say hello in French.", "What is two plus two?"]
    want = [_chat(c, p, max_tokens=8).choices[0].message.content for p in prompts]
    got: dict[int, str] = {}

    def one(i):
        got[i] = _chat(c, prompts[i], max_tokens=8).choices[0].message.content

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(3)] == want


def needle_prompt(n_words: int, depth: float, secret: str, seed: int = 7) -> tuple[str, list[int]]:
    """Filler words with the needle sentence at `depth`; returns (content, needle char span)."""
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(n_words)]
    sentences = [" ".join(words[i:i + 12]).capitalize() + "." for i in range(0, n_words, 12)]
    cut = int(len(sentences) * depth)
    head = " ".join(sentences[:cut])
    needle = f"The secret number is {secret}."
    body = head + (" " if head else "") + needle + " " + " ".join(sentences[cut:])
    question = "\n\nWhat is the secret number in the text above? Answer with the number only."
    start = len(head) + (1 if head else 0)
    return body + question, [start, start + len(needle)]


def test_needle_comes_back_at_500_tokens(server):
    content, span = needle_prompt(380, 0.5, "4817263")
    n = _tokenize(server["base"], {"messages": [{"role": "user", "content": content}]})["count"]
    assert 420 <= n <= 600
    r = _chat(server["client"], content, max_tokens=32, extra_body={"niah_needle_span": span})
    assert "4817263" in r.choices[0].message.content
    rec = r.model_extra["selection_recall"]
    assert len(rec) == 30 and rec == [1.0] * 30                     # inside the window: all kept


def test_selection_recall_sees_a_dropped_needle(server):
    content, span = needle_prompt(620, 0.05, "5936041")
    n = _tokenize(server["base"], {"messages": [{"role": "user", "content": content}]})["count"]
    assert n > WINDOW + 150                                          # the needle lies before the window
    chunks = list(_chat(server["client"], content, max_tokens=1, stream=True,
                        stream_options={"include_usage": True}, extra_body={"niah_needle_span": span}))
    recs = [ch.model_extra.get("selection_recall") for ch in chunks if ch.model_extra.get("selection_recall")]
    assert recs, "the stream carries selection_recall"
    rec = recs[-1]
    assert len(rec) == 30 and all(0.0 <= x <= 1.0 for x in rec)
    assert min(rec) < 1.0                                            # top-64 of ~700 keys misses some of it
    assert json.dumps(rec)


def test_indexer_probe_follows_the_decode_steps(server):
    """`niah_value_span` -> `niah_indexer`: the last prompt token, then each decode step
    until the answer holds the value; per layer rank / k, kept share, margin, fidelity."""
    content, span = needle_prompt(620, 0.05, "5936041")
    value = content.index("5936041", span[0])
    body = dict(extra_body={"niah_value_span": [value, value + 7]}, max_tokens=24)
    r = _chat(server["client"], content, **body)
    probe = r.model_extra["niah_indexer"]
    assert probe["k"] == TOPK and probe["value_tokens"] >= 1
    steps = probe["steps"]
    n = _tokenize(server["base"], {"messages": [{"role": "user", "content": content}]})["count"]
    assert steps[0]["position"] == n - 1 and steps[0]["context"] == n and len(steps) > 1
    assert [s["position"] for s in steps] == list(range(n - 1, n - 1 + len(steps)))
    assert len(steps) <= r.usage.completion_tokens
    if probe["value_complete"]:                  # probing stopped where the value was written
        assert "5936041" in r.choices[0].message.content
    for s in steps:
        assert s["active"] and all(len(s[k]) == 30 for k in ("kept", "rank_best", "rank_worst", "margin", "fidelity"))
        assert all(b <= w for b, w in zip(s["rank_best"], s["rank_worst"]))
        assert all(0.0 <= f <= 1.0 for f in s["fidelity"]) and min(s["fidelity"]) < 1.0   # fp8 keys: not exact
    chunks = list(_chat(server["client"], content, stream=True, stream_options={"include_usage": True}, **body))
    streamed = [c.model_extra.get("niah_indexer") for c in chunks if c.model_extra.get("niah_indexer")]
    assert streamed and streamed[-1] == probe                     # greedy: the same steps again


def test_server_info_attests_what_the_indexer_ran(server):
    """The same attestation record SGLang's plugin reports (niah/attestation/ reads both),
    read before and after a request longer than top-k, judged against labels."""
    from niah.attestation import INVALID, VALID, read_server, status

    start = read_server(server["base"])
    _chat(server["client"], needle_prompt(620, 0.5, "5936041")[0], max_tokens=4)
    end = read_server(server["base"])
    a = end["attestation"]
    assert (a["index_dtype"], a["kernels"], a["fp8_reads_while_bf16"]) == ("fp8", "torch", 0)
    assert a["counts"]["store.fp8"] > 0 and a["counts"]["prefill_logits.fp8"] > 0 and a["counts"]["topk.fp32"] > 0
    assert a["pool_bytes_per_token"] == 3 * (64 + 4)  # 3 kv heads x (64 fp8 values + one fp32 scale)
    assert a["facts"] == {"attention": "dsa", "index_topk": TOPK, "window": WINDOW, "rotation": "none", "query": "fp32",
                          "page_size": None, "prefill_chunk": None, "prefix_cache": False, "index_compress": 1,
                          "faults": []}   # the plain paths: flat index keys, one-pass prefill, no prefix cache
    assert end["internal_states"] is None  # not SGLang-shaped: the record is top-level

    def judged(**label):
        return status({"engine": "embedded", "settings": label,
                       "attestation": {"segments": [{"start": start, "end": end}]}})

    ok = judged(attention="dsa", index_dtype="fp8", index_topk=TOPK)
    assert ok[0] == VALID and ok[1].startswith("fp8/torch, 204 B/token; during the sweep: store +")
    assert judged(index_dtype="bf16") == (INVALID, "labelled index_dtype bf16 but the server ran fp8")
    assert judged(attention="dense") == (INVALID, "labelled attention dense but the server ran dsa")


# -- malformed requests: every one a 400, never a 500, and the server keeps serving ---------
ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/tokenize"]
CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("raw", [
    b"[" * 100_000,                                            # the parser's recursion limit
    b'{"a":' * 100_000,
    b'{"messages": "\xff\xfe caf\xe9"}',                       # not UTF-8
    b'{"prompt": "\\ud800"}',                                  # a lone surrogate
    b"[1, 2]", b'"text"', b"null", b"42",                      # JSON, not an object
    b'{"prompt": "hi", "temperature": NaN}', b'{"prompt": "hi", "max_tokens": Infinity}',
    b'{"prompt": "hi", "temperature": 1e999}',                 # overflows a float
    b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}",   # past int parsing's digit limit
    b"", b"{not json",
], ids=["deep-list", "deep-object", "bad-utf8", "surrogate", "list", "string", "null", "number",
        "nan", "infinity", "float-overflow", "5000-digits", "empty", "garbage"])
def test_malformed_bodies_are_400s(server, raw):
    for path in ENDPOINTS:
        r = httpx.post(server["base"] + path, content=raw, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 400, (path, r.status_code, r.text[:300])
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == 400 and err["message"]
        assert "JSON" in err["message"]
    assert _chat(server["client"], "Hi", max_tokens=2).usage.completion_tokens >= 1


@pytest.mark.parametrize("path, extra, param", [
    ("/v1/chat/completions", {"model": 5}, "model"),
    ("/v1/chat/completions", {"stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"stream": True, "stream_options": [True]}, "stream_options"),
    ("/v1/chat/completions", {"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ("/v1/chat/completions", {"messages": {"role": "user", "content": "hi"}}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": ["user"], "content": "hi"}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": {}, "content": "hi"}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ("/v1/chat/completions", {"max_tokens": 1.5}, "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": "10"}, "max_tokens"),
    ("/v1/chat/completions", {"max_tokens": 10 ** 30}, "max_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": True}, "max_completion_tokens"),
    ("/v1/chat/completions", {"stop": {"a": 1}}, "stop"),
    ("/v1/chat/completions", {"stop": [1]}, "stop"),
    ("/v1/chat/completions", {"n": True}, "n"),
    ("/v1/chat/completions", {"n": "1"}, "n"),
    ("/v1/chat/completions", {"temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"temperature": True}, "temperature"),
    ("/v1/chat/completions", {"top_p": 2}, "top_p"),
    ("/v1/chat/completions", {"niah_needle_span": [0.0, 1]}, "niah_needle_span"),
    ("/v1/chat/completions", {"niah_value_span": "ab"}, "niah_value_span"),
    ("/v1/chat/completions", {"niah_value_span": [0, 10 ** 30]}, "niah_value_span"),
    ("/v1/completions", {"prompt": [1, 2, 3]}, "prompt"),
    ("/v1/completions", {"prompt": None}, "prompt"),
    ("/tokenize", {"messages": "hi"}, "messages"),
    ("/tokenize", {"prompt": 5}, "prompt"),
])
def test_wrong_field_types_are_400s(server, path, extra, param):
    body = {**CHAT, **extra} if path != "/v1/completions" else {"model": "x", **extra}
    if path == "/tokenize":
        body = {k: v for k, v in body.items() if k != "model"} if "messages" in extra else extra
    r = httpx.post(server["base"] + path, json=body, timeout=60)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


# -- a client that goes away cancels its generation ----------------------------------------
COUNTING = "1, 2, 3, 4, 5, 6,"            # greedy SmolLM2 keeps counting: never an early end token


def _requests(base: str) -> dict:
    r = httpx.get(base + "/server_info", timeout=60)
    assert r.status_code == 200
    return r.json()["requests"]


def _wait_for(base: str, what: str, pred) -> dict:
    """Poll /server_info until pred(requests) holds (a guard against hanging, not a timing claim)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        req = _requests(base)
        if pred(req):
            return req
        time.sleep(0.05)
    pytest.fail(f"the server never reported {what}: {req}")


def _raw_post(base: str, path: str, body: dict) -> socket.socket:
    """A request on a plain socket, left unread; closing the socket is the client going away."""
    host, port = base.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=60)
    data = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def _completion(server, prompt: str, n: int) -> str:
    return server["client"].completions.create(model="x", prompt=prompt, max_tokens=n, temperature=0).choices[0].text


def test_a_client_that_leaves_mid_decode_cancels_its_generation(server):
    base, max_tokens = server["base"], 4000            # uncancelled: minutes of decoding here
    ref = _completion(server, "The capital of France is", 10)
    before = _requests(base)
    s = _raw_post(base, "/v1/completions", {"model": "x", "prompt": COUNTING, "max_tokens": max_tokens})
    _wait_for(base, "the request decoding", lambda r: (r["running"] or {}).get("completion_tokens", 0) >= 2)
    s.close()
    assert _completion(server, "The capital of France is", 10) == ref   # served; the caches are clean
    after = _requests(base)
    assert after["cancelled"] == before["cancelled"] + 1 and after["running"] is None and after["waiting"] == 0
    gone = after["last_cancelled"]
    assert (gone["cancelled_at"], gone["stream"], gone["max_tokens"]) == ("decode", False, max_tokens)
    assert 2 <= gone["completion_tokens"] < max_tokens
    assert after["completed"] == before["completed"] + 1          # the abandoned one is not counted as served


def test_a_client_that_leaves_mid_prefill_frees_the_model_within_a_layer(server):
    base = server["base"]
    ref = _chat(server["client"], "Say hello in French.", max_tokens=6).choices[0].message.content
    n_layers = httpx.get(base + "/server_info", timeout=60).json()["n_layers"]
    before = _requests(base)
    s = _raw_post(base, "/v1/chat/completions", {"model": "x",
                                                 "messages": [{"role": "user", "content": "word " * 7000}],
                                                 "max_tokens": 64})
    _wait_for(base, "the prefill's first layer running",
              lambda r: (r["running"] or {}).get("stage") == "prefill" and r["running"]["prefill_layers"] >= 1)
    s.close()
    assert _chat(server["client"], "Say hello in French.", max_tokens=6).choices[0].message.content == ref
    after = _requests(base)
    assert after["cancelled"] == before["cancelled"] + 1 and after["running"] is None
    gone = after["last_cancelled"]
    assert gone["cancelled_at"] == "prefill" and gone["completion_tokens"] == 0 and gone["prompt_tokens"] > 7000
    assert 1 <= gone["prefill_layers"] < n_layers, gone              # stopped inside the prompt's forward pass


def test_a_stream_closed_early_cancels_its_generation(server):
    base, max_tokens = server["base"], 4000
    before = _requests(base)
    with httpx.stream("POST", base + "/v1/completions", timeout=300, json={
            "model": "x", "prompt": COUNTING, "max_tokens": max_tokens, "stream": True}) as r:
        assert r.status_code == 200
        got = 0
        for line in r.iter_lines():
            got += line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"] != ""
            if got >= 3:
                break
    ok = _chat(server["client"], "Hi", max_tokens=3)
    assert ok.usage.completion_tokens >= 1
    after = _requests(base)
    assert after["cancelled"] == before["cancelled"] + 1 and after["running"] is None
    gone = after["last_cancelled"]
    assert (gone["cancelled_at"], gone["stream"]) == ("decode", True)
    assert 3 <= gone["completion_tokens"] < max_tokens
