"""Scoring edge cases found in review: distractors and separators between numbers."""

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from niah.client import RequestConfig, complete, make_client
from niah.sweep.scoring import score


def test_listing_every_value_is_not_recall():
    answer = "The number for Lisbon is 1234567, and for Paris it is 4829163."
    assert score("4829163", answer) == "correct"
    assert score("4829163", answer, distractors=["1234567"]) == "wrong"
    assert score("4829163", "It is 4829163.", distractors=["1234567"]) == "correct"


def test_a_newline_separates_two_numbers():
    assert score("4829163", "4829163\n2") == "correct"
    assert score("48291632", "4829163\n2") == "wrong"
    assert score("4829163", "4,829,163") == "correct"
    assert score("4829163", "14829163") == "wrong"


# -- a server that answers 200 with something that is not an OpenAI reply ----------------------


class _Odd(BaseHTTPRequestHandler):
    body = b"<html>proxy login</html>"
    ctype = "text/html"

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", self.ctype)
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
@pytest.mark.parametrize("body", [b"<html>proxy login</html>", b"[1, 2]"], ids=["html", "json-list"])
def test_a_malformed_reply_is_the_trials_error_not_a_crash(stream, body):
    handler = type("H", (_Odd,), {"body": body})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        cfg = RequestConfig(endpoint=f"http://127.0.0.1:{srv.server_port}/v1", model="m", stream=stream, retries=0)

        async def go():
            async with make_client(cfg) as client:
                return await complete(client, cfg, {"messages": [{"role": "user", "content": "hi"}]})

        reply = asyncio.run(go())
    finally:
        srv.shutdown()
    assert reply.error and ("not JSON" in reply.error or "not a JSON object" in reply.error)
    assert score("4829163", reply.answer, error=reply.error) == "error"
