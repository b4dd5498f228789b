"""Test MCP server for loom-mcp, written with the official Python SDK (`pip install mcp`).

Runs over stdio by default; `--http --port 0` serves streamable HTTP on 127.0.0.1 (at `/mcp`)
and prints `PORT <n>` on stdout once it listens; `--sse` serves the older HTTP+SSE transport the
same way (stream at `/sse`, messages posted to `/messages/`). `--connections FILE` appends one line per initialize
(process start for stdio), so tests can count connections. `unlock` adds the tool `secret`
and `lock` removes it, each then sending `notifications/tools/list_changed`. `--log-stderr` writes a line to
stderr at start (tests check it reaches the logs, not the protocol stream). `--grandchild FILE`
starts a `sleep` child and writes its pid (tests check shutdown stops the whole process group).
"""

import argparse
import asyncio
import base64
import os
import socket
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import AudioContent, BlobResourceContents, EmbeddedResource, ImageContent, ToolAnnotations

# A 1x1 transparent PNG.
PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

# The header of a WAV file and a minimal PDF.
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "
PDF = b"%PDF-1.7\n%%EOF\n"

server = MCPServer("loom-test-py")


def idempotency_key(ctx: Context) -> str | None:
    meta = ctx.request_context.meta or {}
    return meta.get("loom-ia/idempotency_key")


@server.tool(description="Echoes the text back.")
def echo(text: str) -> str:
    return text


@server.tool(description="Adds two integers.", annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> dict:
    return {"sum": a + b}


@server.tool(
    description="Sends an e-mail (pretend); returns the idempotency key it received.",
    annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False),
)
def send_mail(to: str, ctx: Context) -> str:
    return f"sent to {to}; key={idempotency_key(ctx)}"


@server.tool(description="Sleeps `seconds` then answers.", annotations=ToolAnnotations(read_only_hint=True))
async def slow(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool(description="Exits the server process in the middle of the call.")
def crash() -> str:
    sys.stdout.flush()
    os._exit(3)


@server.tool(description="Returns a tiny PNG.", annotations=ToolAnnotations(read_only_hint=True))
def image() -> ImageContent:
    return ImageContent(type="image", data=base64.b64encode(PNG_1X1).decode(), mime_type="image/png")


@server.tool(description="Returns a short WAV sound.", annotations=ToolAnnotations(read_only_hint=True))
def sound() -> AudioContent:
    return AudioContent(type="audio", data=base64.b64encode(WAV).decode(), mime_type="audio/wav")


@server.tool(description="Returns a PDF document as an embedded resource.", annotations=ToolAnnotations(read_only_hint=True))
def document() -> EmbeddedResource:
    blob = BlobResourceContents(uri="file:///exports/devis-D-1.pdf", mime_type="application/pdf", blob=base64.b64encode(PDF).decode())
    return EmbeddedResource(type="resource", resource=blob)


@server.tool(description="Always fails with a tool error.", annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False))
def fail(reason: str = "nope") -> str:
    raise ToolError(f"failed on purpose: {reason}")


@server.tool(
    description="Returns its pid (connection counting).",
    annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True),
)
def pid() -> str:
    return str(os.getpid())


def secret() -> str:
    """Tells the secret (offered once `unlock` was called)."""
    return "the secret is 42"


@server.tool(description="Adds the tool `secret` and announces the change (tools/list_changed).")
async def unlock(ctx: Context) -> str:
    if "secret" not in {tool.name for tool in await server.list_tools()}:
        server.add_tool(secret, name="secret", annotations=ToolAnnotations(read_only_hint=True))
    await ctx.session.send_tool_list_changed()
    return "unlocked"


@server.tool(description="Removes the tool `secret` and announces the change (tools/list_changed).")
async def lock(ctx: Context) -> str:
    if "secret" in {tool.name for tool in await server.list_tools()}:
        server.remove_tool("secret")
    await ctx.session.send_tool_list_changed()
    return "locked"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--sse", action="store_true", help="serve the older HTTP+SSE transport")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--connections")
    parser.add_argument("--log-stderr", action="store_true")
    parser.add_argument("--grandchild", help="start `sleep 120` in the same process group, write its pid here")
    args = parser.parse_args()
    if args.grandchild:
        import subprocess

        sleeper = subprocess.Popen(["sleep", "120"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        with open(args.grandchild, "w") as f:
            f.write(f"{sleeper.pid}\n")
    if args.log_stderr:
        print("py_server starting (stderr line)", file=sys.stderr, flush=True)
    if args.connections:
        with open(args.connections, "a") as f:
            f.write(f"{os.getpid()}\n")
    if not (args.http or args.sse):
        server.run()
        return

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)
    port = sock.getsockname()[1]
    app = server.sse_app() if args.sse else server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    print(f"PORT {port}", flush=True)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
