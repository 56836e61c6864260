"""A stub of a vLLM server speaking TRL's client protocol (/health, /v1/models, /server_info, /v1/completions with
token ids), for the vllm-server backend's tests: no server runs on a CPU.

    with stub_vllm_server(lambda prompt, k: [len(prompt), k]) as url:   # token ids of the k-th sample of a prompt
        engine = VLLMServerEngine(base_url=url, timeout=5)
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer


@contextlib.contextmanager
def stub_vllm_server(sample: Callable[[list[int], int, int], list[int]]) -> Iterator[str]:
    """Serve `sample(prompt_ids, k, max_tokens) -> completion ids` on a free port; yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def _json(self, obj):
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802
            if self.path.startswith("/v1/models"):
                self._json({"data": [{"id": "stub"}]})
            elif self.path.startswith("/server_info"):
                self._json({"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}})
            else:
                self._json({})

        def do_POST(self):  # noqa: N802
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._json(
                {
                    "choices": [
                        {"prompt_token_ids": p, "token_ids": sample(p, k, req["max_tokens"]), "logprobs": None}
                        for p in req["prompt"]
                        for k in range(req["n"])
                    ]
                }
            )

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
