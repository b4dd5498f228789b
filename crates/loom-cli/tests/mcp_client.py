"""An MCP client (the official Python SDK) that drives Loom's MCP server for the Rust tests of
crates/loom-cli/tests/mcp_server.rs.

Each scenario talks to the server as a real client would, and prints on its last stdout line a
JSON object of what it observed; the Rust test asserts on it.

    python3 mcp_client.py <scenario> '<json arguments>'

Stdio scenarios start the server themselves (`args.command`); HTTP scenarios connect to
`args.url` with `args.key` as a bearer token.
"""

import asyncio
import base64
import json
import sys

import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

# A 1x1 PNG image.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de"
        "0000000c49444154789c63f80f00000101000518d84e0000000049454e44ae426082"
    )
).decode()


def stdio(args, **options):
    params = StdioServerParameters(command=args["command"], args=args["args"], cwd=args.get("cwd"))
    return Client(params, mode=args.get("mode", "auto"), **options)


def http(url, key, **options):
    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=120)
    return Client(streamable_http_client(url, http_client=client), mode=options.pop("mode", "auto"), **options)


def texts(result):
    return [block.text for block in result.content if getattr(block, "type", "") == "text"]


def call_view(result):
    """What a test needs of a tool result."""
    return {
        "is_error": bool(result.is_error),
        "texts": texts(result),
        "structured": result.structured_content,
    }


async def read(client, uri):
    """A resource's text (JSON parsed when it is JSON), or the error it raised."""
    try:
        result = await client.read_resource(uri)
    except MCPError as error:
        return {"error": str(error)}
    content = result.contents[0]
    if getattr(content, "blob", None) is not None:
        return {"blob": content.blob, "mime_type": content.mime_type}
    text = content.text
    if content.mime_type == "application/json":
        return {"json": json.loads(text)}
    return {"text": text, "mime_type": content.mime_type}


async def call(client, name, arguments, **options):
    try:
        return call_view(await client.call_tool(name, arguments, **options))
    except MCPError as error:
        return {"protocol_error": str(error)}


async def basics(args):
    """Tools, an agent call with progress, the control tools, resources, attachments, cancel."""
    out = {}
    progress = []

    async def on_progress(value, total, message):
        progress.append({"progress": value, "message": message})

    async with stdio(args) as client:
        out["protocol"] = client.protocol_version
        out["server"] = client.server_info.name if client.server_info else None
        tools = (await client.list_tools()).tools
        out["tools"] = [tool.name for tool in tools]
        devis = next(tool for tool in tools if tool.name == "devis")
        out["devis_input"] = devis.input_schema
        out["devis_output_required"] = (devis.output_schema or {}).get("required")
        first = await call(client, "devis", {"message": "Prix TTC de 1 250 € HT à 10 % ?", "session_id": "s-devis"},
                           progress_callback=on_progress)
        out["devis"] = first
        out["progress"] = progress
        run_id = first["structured"]["run_id"]
        out["again"] = await call(client, "devis", {"message": "Et le même ?", "session_id": "s-devis"})
        out["run_status"] = await call(client, "run_status", {"run_id": run_id, "session_id": "s-devis"})
        out["run_status_no_session"] = await call(client, "run_status", {"run_id": run_id})
        out["run_report_no_session"] = await call(client, "run_report", {"run_id": run_id})
        out["run_no_session"] = await read(client, f"loom://runs/{run_id}")
        out["run_events_no_session"] = await read(client, f"loom://runs/{run_id}/events")
        out["trace_no_session"] = await read(client, f"loom://traces/{run_id}")
        out["run_report"] = await call(client, "run_report", {"run_id": run_id, "session_id": "s-devis"})
        out["session_report"] = await call(client, "run_report", {"session_id": "s-devis"})
        out["report_nothing"] = await call(client, "run_report", {})
        out["resources"] = [r.uri for r in (await client.list_resources()).resources]
        out["templates"] = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
        out["runs"] = await read(client, "loom://runs")
        out["runs_filtered"] = await read(client, "loom://runs?agent=devis&status=completed,failed&limit=1")
        out["runs_none"] = await read(client, "loom://runs?status=paused&status=cancelled")
        out["runs_since"] = await read(client, "loom://runs?since=2999-01-01")
        out["runs_bad_status"] = await read(client, "loom://runs?status=done")
        out["runs_bad_limit"] = await read(client, "loom://runs?limit=0")
        out["runs_bad_since"] = await read(client, "loom://runs?since=hier")
        out["runs_unknown"] = await read(client, "loom://runs?tenant=acme")
        out["sessions"] = await read(client, "loom://sessions")
        out["run"] = await read(client, f"loom://runs/{run_id}?session_id=s-devis")
        out["run_events"] = await read(client, f"loom://runs/{run_id}/events?session_id=s-devis")
        out["trace"] = await read(client, f"loom://traces/{run_id}?session_id=s-devis")
        out["session"] = await read(client, "loom://sessions/s-devis")
        out["session_events"] = await read(client, "loom://sessions/s-devis/events")
        out["unknown_resource"] = await read(client, "loom://nothing")
        # Attachments: a base64 image, then the artifact it became, then files.
        with_image = await call(client, "devis", {
            "message": "Prix TTC du devis ci-joint ?", "session_id": "s-files",
            "attachments": [{"data": PNG, "media_type": "image/png", "name": "devis.png"}],
        })
        out["with_image"] = with_image
        events = await read(client, f"loom://runs/{with_image['structured']['run_id']}/events?session_id=s-files")
        stored = [e["payload"]["uri"] for e in events["json"] if e["type"] == "artifact.stored"]
        out["stored"] = stored
        if stored:
            uri = stored[0]
            out["artifact_by_loom_uri"] = await read(client, "loom://artifacts/" + uri[len("artifact://"):])
            out["artifact_by_uri"] = await read(client, uri)
            out["with_artifact_link"] = await call(client, "devis", {
                "message": "Et avec le même fichier ?", "session_id": "s-files",
                "attachments": [{"uri": uri}],
            })
        out["png"] = PNG
        out["with_file"] = await call(client, "devis", {
            "message": "Prix TTC du plan ?", "attachments": [{"uri": args["inside"]}],
        })
        # A run opened without a session is addressed by its id alone.
        lone = (out["with_file"].get("structured") or {}).get("run_id")
        out["with_file_status"] = await call(client, "run_status", {"run_id": lone})
        out["with_file_trace"] = await read(client, f"loom://traces/{lone}")
        out["outside_file"] = await call(client, "devis", {
            "message": "Prix TTC du plan ?", "attachments": [{"uri": args["outside"]}],
        })
        out["bad_base64"] = await call(client, "devis", {
            "message": "Prix ?", "attachments": [{"data": "not base64!", "media_type": "image/png"}],
        })
        out["bad_arguments"] = await call(client, "devis", {"text": "Prix ?"})
        out["hidden_agent"] = await call(client, "interne", {"message": "Bonjour"})
        # Cancel a long run from another call while its tool call is in flight.
        waiting = asyncio.create_task(client.call_tool("attente", {"message": "Attends la banque.", "session_id": "s-wait"}))
        running = await first_run(client, "s-wait", "awaiting_tools")
        out["running"] = running
        out["cancel"] = await call(client, "cancel", {"run_id": running, "session_id": "s-wait", "by": "test"})
        out["cancelled_call"] = call_view(await waiting)
        out["cancel_again"] = await call(client, "cancel", {"run_id": running, "session_id": "s-wait"})
        out["cancel_unknown"] = await call(client, "cancel", {"run_id": "nope"})
        # A call the client gives up cancels its run.
        abandoned = asyncio.create_task(client.call_tool("attente", {"message": "Attends encore.", "session_id": "s-abandon"}))
        out["abandoned_running"] = await first_run(client, "s-abandon", "awaiting_tools")
        abandoned.cancel()
        try:
            await abandoned
        except asyncio.CancelledError:
            pass
        out["abandoned"] = await first_run(client, "s-abandon", "cancelled")
    return out


async def first_run(client, session, status):
    """The first run of `session` once it has `status` (polled), or None."""
    for _ in range(600):
        seen = await read(client, f"loom://sessions/{session}")
        runs = seen.get("json", {}).get("runs", [])
        if runs and runs[0]["status"] == status:
            return runs[0]["run_id"]
        await asyncio.sleep(0.1)
    return None


async def approval(args):
    """An agent whose tool needs approval: asked by elicitation when the client can."""
    asked = []

    async def elicit(context, params):
        schema = params.requested_schema
        if hasattr(schema, "model_dump"):
            schema = schema.model_dump(by_alias=True, exclude_none=True)
        asked.append({"message": params.message, "schema": schema})
        if args["answer"] == "cancel":
            return types.ElicitResult(action="cancel")
        return types.ElicitResult(action="accept", content={"decision": args["answer"], "reason": "vu avec la compta"})

    options = {} if args["answer"] == "none" else {"elicitation_callback": elicit}
    async with stdio(args, **options) as client:
        result = await call(client, "paiement", {"message": "Règle la facture F-2024-031."})
        return {"protocol": client.protocol_version, "asked": asked, "result": result}


async def status(args):
    """run_status of a run (after a decision made elsewhere)."""
    async with stdio(args) as client:
        return {"status": await call(client, "run_status", {"run_id": args["run_id"]})}


async def calls(args):
    """Tool calls over stdio, in order (no elicitation: a run that needs approval pauses)."""
    async with stdio(args) as client:
        return {"calls": [await call(client, name, arguments) for name, arguments in args["calls"]]}


async def tenant_view(args):
    """What a stdio client of one tenant sees of a run of another."""
    async with stdio(args) as client:
        return await foreign(client, args)


async def foreign(client, args):
    run, session, artifact = args["run_id"], args["session_id"], args.get("artifact")
    seen = {
        "run_status": await call(client, "run_status", {"run_id": run, "session_id": session}),
        "run_status_search": await call(client, "run_status", {"run_id": run}),
        "run_report": await call(client, "run_report", {"run_id": run, "session_id": session}),
        "session_report": await call(client, "run_report", {"session_id": session}),
        "cancel": await call(client, "cancel", {"run_id": run, "session_id": session}),
        "runs": await read(client, "loom://runs"),
        "sessions": await read(client, "loom://sessions"),
        "run": await read(client, f"loom://runs/{run}?session_id={session}"),
        "run_events": await read(client, f"loom://runs/{run}/events?session_id={session}"),
        "trace": await read(client, f"loom://traces/{run}?session_id={session}"),
        "session": await read(client, f"loom://sessions/{session}"),
        "session_events": await read(client, f"loom://sessions/{session}/events"),
    }
    if artifact:
        seen["artifact"] = await read(client, artifact)
        seen["artifact_by_loom_uri"] = await read(client, "loom://artifacts/" + artifact[len("artifact://"):])
        seen["artifact_attached"] = await call(client, "devis", {"message": "Prix ?", "attachments": [{"uri": artifact}]})
    return seen


async def http_scenario(args):
    """Over streamable HTTP with an API key: tools, a call with progress, resources; then, for
    another key's run, what this key sees of it."""
    out = {}
    progress = []

    async def on_progress(value, total, message):
        progress.append(message)

    async with http(args["url"], args["key"], mode=args.get("mode", "auto")) as client:
        out["protocol"] = client.protocol_version
        out["tools"] = [tool.name for tool in (await client.list_tools()).tools]
        out["resources"] = [r.uri for r in (await client.list_resources()).resources]
        if args.get("call"):
            out["devis"] = await call(client, "devis", {
                "message": "Prix TTC ?", "session_id": args.get("session", "s-http"),
                "attachments": [{"data": PNG, "media_type": "image/png"}],
            }, progress_callback=on_progress)
            out["progress"] = progress
            if out["devis"].get("structured"):
                run_id = out["devis"]["structured"]["run_id"]
                out["run_status"] = await call(client, "run_status", {"run_id": run_id, "session_id": args.get("session", "s-http")})
                events = await read(client, f"loom://runs/{run_id}/events?session_id={args.get('session', 's-http')}")
                out["run_events"] = events
                out["runs"] = await read(client, "loom://runs")
        if args.get("paiement"):
            out["paiement"] = await call(client, "paiement", {"message": "Règle la facture."})
        if args.get("foreign"):
            out["foreign"] = await foreign(client, args["foreign"])
        out["reads"] = {uri: await read(client, uri) for uri in args.get("reads", [])}
        out["calls"] = [await call(client, name, arguments) for name, arguments in args.get("calls", [])]
    return out


SCENARIOS = {
    "basics": basics,
    "approval": approval,
    "status": status,
    "calls": calls,
    "tenant_view": tenant_view,
    "http": http_scenario,
}


def main():
    scenario, arguments = sys.argv[1], json.loads(sys.argv[2])
    observed = asyncio.run(SCENARIOS[scenario](arguments))
    print(json.dumps(observed))


if __name__ == "__main__":
    main()
