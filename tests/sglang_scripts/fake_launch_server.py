"""A stand-in for ``python -m sglang.launch_server`` (CPU test): answers /v1/models, /server_info
and chat completions like the in-process fake, logs SGLang's ready line."""
import hashlib, json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _json(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self._json({"object": "list", "data": [{"id": "m", "object": "model"}], "version": "fake"})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        parts = req["messages"][0]["content"]
        n_img = sum(p["type"] == "image_url" for p in parts)
        n_vid = sum(p["type"] == "video_url" for p in parts)
        ids = list(hashlib.sha256(json.dumps(parts).encode()).digest()[: req["max_tokens"]])
        choice = {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length",
                  "response_token_ids": ids,
                  "prompt_token_ids": [1] + [151655] * (5 * n_img) + [151656] * (1196 * n_vid)}
        self._json({"id": "c", "object": "chat.completion", "created": 0, "model": req["model"], "choices": [choice],
                    "usage": {"prompt_tokens": 9, "completion_tokens": len(ids), "total_tokens": 9}})

srv = ThreadingHTTPServer(("127.0.0.1", port), H)
print("The server is fired up and ready to roll!", flush=True)
srv.serve_forever()
