"""A small MCP server (official Python SDK) that keeps notes in a JSON file.

Loom starts it over stdio (see loom.yaml); any MCP client can use it too.
Requires: pip install mcp
"""
import json
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

STORE = Path(os.environ.get("NOTES_FILE", "notes.json"))

server = MCPServer("notes")


def load() -> list[dict]:
    if STORE.exists():
        return json.loads(STORE.read_text(encoding="utf-8"))
    return []


@server.tool(annotations=ToolAnnotations(destructiveHint=False, idempotentHint=False))
def add_note(client: str, text: str) -> str:
    """Records a note about a client (for example a quote to chase)."""
    notes = load()
    notes.append({"client": client, "text": text})
    STORE.parent.mkdir(parents=True, exist_ok=True)
    STORE.write_text(json.dumps(notes, ensure_ascii=False, indent=2), encoding="utf-8")
    return f"Note {len(notes)} recorded for {client}."


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def search_notes(client: str) -> str:
    """Lists the notes recorded about a client."""
    found = [n["text"] for n in load() if n["client"].lower() == client.lower()]
    if not found:
        return f"No note about {client}."
    return "\n".join(f"- {text}" for text in found)


if __name__ == "__main__":
    print("notes server ready", file=sys.stderr)
    server.run()
