"""A small HTTP API for the `openapi` tool source tests (crates/loom-cli/tests/tool_sources.rs).

Usage: python3 openapi_server.py LOG_FILE TOKEN
Prints the port it listens on (127.0.0.1), then serves until killed. Every request is appended
to LOG_FILE as one JSON line (method, path, query, authorization, body). Requests without
`Authorization: Bearer TOKEN` get 401.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

LOG, TOKEN = sys.argv[1], sys.argv[2]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, value):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def handle_any(self, method):
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        with open(LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps({
                "method": method,
                "path": url.path,
                "query": parse_qs(url.query),
                "authorization": self.headers.get("Authorization"),
                "body": body,
            }) + "\n")
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.answer(401, {"error": "unauthorized"})
        if method == "GET" and url.path.startswith("/api/orders/"):
            order = url.path.rsplit("/", 1)[1]
            return self.answer(200, {"id": order, "status": "shipped"})
        if method == "POST" and url.path == "/api/orders":
            return self.answer(201, {"id": "O-9", "item": (body or {}).get("item")})
        return self.answer(404, {"error": "no such route"})

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
