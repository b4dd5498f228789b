"""An MCP client (the official Python SDK) that drives `loom-notes serve` for the Rust tests of
crates/loom-notes/tests/mcp.rs.

    python3 mcp_client.py <scenario> '<json arguments>'

A server is given either as `{"command": ..., "args": [...], "env": {...}}` (stdio: the client
starts it) or as `{"url": "http://127.0.0.1:PORT/mcp"}` (streamable HTTP: already running).
The scenario prints on its last stdout line a JSON object of what it observed; the Rust test
asserts on it.
"""

import asyncio
import http.server
import json
import sys
import threading

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

PAGE = b"""<!doctype html><html><head><title>Release notes</title>
<meta property="og:title" content="Loom 2.0 release notes"></head>
<body><nav>menu</nav><main><h1>Loom 2.0</h1><p>The journal is now compacted every night.</p>
</main><footer>footer</footer></body></html>"""


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args):
        pass


def page_server():
    """A local web server with one page, on a free loopback port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def connect(spec):
    if "url" in spec:
        return Client(streamable_http_client(spec["url"]))
    params = StdioServerParameters(command=spec["command"], args=spec["args"], env=spec.get("env"))
    return Client(params)


def texts(result):
    return [block.text for block in result.content if getattr(block, "type", "") == "text"]


async def call(client, name, arguments):
    try:
        result = await client.call_tool(name, arguments)
    except MCPError as error:
        return {"protocol_error": str(error)}
    return {"is_error": bool(result.is_error), "texts": texts(result), "structured": result.structured_content}


def tool_view(tool):
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
    return {
        "name": tool.name,
        "title": tool.title,
        "description": tool.description,
        "input": tool.input_schema,
        "output": tool.output_schema,
        "annotations": annotations,
    }


async def full(args):
    """Everything a client does, on a server allowing private addresses and a file root
    (`open`), and on one that does not (`strict`)."""
    out = {}
    pages = page_server()
    url = f"http://127.0.0.1:{pages.server_address[1]}/notes.html"
    try:
        async with connect(args["open"]) as client:
            out["server"] = {"name": client.server_info.name, "version": client.server_info.version}
            out["instructions"] = client.instructions
            out["tools"] = [tool_view(tool) for tool in (await client.list_tools()).tools]
            added = await call(client, "add_text", {
                "text": "Qdrant stores the vectors. The gRPC port is 6334.",
                "title": "Qdrant note", "project": "Alpha", "tags": ["Rag", "rag", " Search "],
            })
            out["add_text"] = added
            doc_id = (added.get("structured") or {}).get("doc_id")
            out["duplicate"] = await call(client, "add_text", {
                "text": "qdrant stores   the vectors. The gRPC port is 6334.",
                "title": "Same again", "project": "beta",
            })
            out["search"] = await call(client, "search", {"query": "qdrant grpc port"})
            out["search_other_project"] = await call(client, "search", {"query": "qdrant", "project": "beta"})
            out["search_tags"] = await call(client, "search", {"query": "qdrant", "tags": ["rag", "search"]})
            out["get"] = await call(client, "get", {"doc_id": doc_id})
            out["list_docs"] = await call(client, "list_docs", {})
            out["projects"] = await call(client, "projects", {})
            out["update"] = await call(client, "update", {"doc_id": doc_id, "text": "Qdrant listens on 6333 for REST."})
            out["search_updated"] = await call(client, "search", {"query": "rest 6333"})
            out["add_file_outside"] = await call(client, "add_file", {"path": args["outside"], "project": "alpha"})
            out["add_file_inside"] = await call(client, "add_file", {"path": args["inside"], "project": "alpha"})
            out["add_url"] = await call(client, "add_url", {"url": url, "project": "web"})
            out["search_url"] = await call(client, "search", {"query": "journal compacted night"})
            out["delete"] = await call(client, "delete", {"doc_id": doc_id})
            out["get_deleted"] = await call(client, "get", {"doc_id": doc_id})
            out["search_empty"] = await call(client, "search", {"query": "zzzz unknown words"})
            out["k_0"] = await call(client, "search", {"query": "q", "k": 0})
            out["n_51"] = await call(client, "list_docs", {"n": 51})
            out["title_ab"] = await call(client, "add_text", {"text": "t", "title": "ab", "project": "p"})
            out["missing_query"] = await call(client, "search", {})
            out["unknown_field"] = await call(client, "projects", {"verbose": True})
            out["unknown_tool"] = await call(client, "nonexistent_tool", {})
        async with connect(args["strict"]) as client:
            out["add_url_private"] = await call(client, "add_url", {"url": url, "project": "web"})
            out["add_file_no_roots"] = await call(client, "add_file", {"path": args["inside"], "project": "alpha"})
    finally:
        pages.shutdown()
    return out


async def search(args):
    """One search (the CLI and the server on one data directory)."""
    async with connect(args["server"]) as client:
        return await call(client, "search", {"query": args["query"]})


SCENARIOS = {"full": full, "search": search}


def main():
    scenario, arguments = sys.argv[1], json.loads(sys.argv[2])
    observed = asyncio.run(SCENARIOS[scenario](arguments))
    print(json.dumps(observed))


if __name__ == "__main__":
    main()
