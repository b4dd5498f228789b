// A run's page (`#/run/<session>/<run>`): its figures, the approvals it waits for (with the
// approve and reject buttons for a key with the `approve` scope), its trace as a tree of
// steps, and its events live over SSE (`GET /v1/runs/{id}/events`), which refresh the tree.

import { ApiFailure, call, stream, type StreamEvent } from "./api";
import { cost, duration, h, replace, when, type Child } from "./dom";
import { hashOf } from "./runs";
import { build, render } from "./tree";
import type { PendingApproval, RunResult, Trace, WhoAmI } from "./types";

/** What the page shows of one run, kept across refreshes. */
interface RunView {
  session: string;
  runId: string;
  who: WhoAmI;
  summary: HTMLElement;
  approvals: HTMLElement;
  tree: HTMLElement;
  events: HTMLOListElement;
  live: HTMLElement;
  signal: AbortSignal;
}

function query(view: RunView): string {
  return `session_id=${encodeURIComponent(view.session)}`;
}

function path(view: RunView, suffix = ""): string {
  return `/v1/runs/${encodeURIComponent(view.runId)}${suffix}`;
}

function figure(label: string, value: Child, testid?: string): HTMLElement {
  return h("div", { class: "figure", "data-testid": testid }, h("span", { class: "label" }, label), h("span", { class: "value" }, value));
}

function showSummary(view: RunView, result: RunResult, trace: Trace): void {
  const usage = trace.usage ?? {};
  replace(
    view.summary,
    figure("Agent", trace.agent),
    figure("Status", h("span", { class: `status status-${trace.status}`, "data-testid": "run-status" }, trace.status)),
    figure("Model calls", String(trace.iterations)),
    figure("Tokens (in → out)", `${usage.input_tokens ?? 0} → ${usage.output_tokens ?? 0}`),
    figure("Cost", cost(trace.cost_usd) || "$0"),
    figure("Active time", duration(trace.active_ms)),
    trace.content
      ? result.text
        ? h("div", { class: "answer", "data-testid": "answer" }, h("span", { class: "label" }, "Answer"), h("pre", null, result.text))
        : null
      : h(
          "div",
          { class: "banner hidden-banner", "data-testid": "content-hidden" },
          "Content hidden: this key lacks the read_content scope, so messages, arguments and results are not shown",
          trace.redacted?.length ? ` (${trace.redacted.length} field(s) removed by the API)` : "",
          ".",
        ),
    result.error ? h("div", { class: "banner error" }, `${result.error_type ?? "error"}: ${result.error}`) : null,
  );
}

async function decide(view: RunView, approval: PendingApproval, verdict: "approve" | "reject", reason: string): Promise<void> {
  const body: Record<string, unknown> = { call_id: approval.call_id, session_id: view.session, by: "ui" };
  if (reason) body.reason = reason;
  await call(path(view, `/${verdict}`), "POST", body);
}

function approvalItem(view: RunView, approval: PendingApproval, refresh: () => void): HTMLElement {
  const canDecide = view.who.scopes.includes("approve");
  const message = h("span", { class: "decision-message", role: "status" });
  const reason = h("input", { class: "reason", placeholder: "reason (optional)", "data-testid": "reject-reason" });
  const act = (verdict: "approve" | "reject") => async () => {
    for (const button of item.querySelectorAll("button")) button.disabled = true;
    message.textContent = verdict === "approve" ? "approving…" : "rejecting…";
    try {
      await decide(view, approval, verdict, reason.value.trim());
      message.textContent = verdict === "approve" ? "approved" : "rejected";
      refresh();
    } catch (error) {
      message.textContent = error instanceof Error ? error.message : String(error);
      for (const button of item.querySelectorAll("button")) button.disabled = false;
    }
  };
  const item = h(
    "li",
    { class: "approval", "data-call-id": approval.call_id },
    h("span", { class: "kind kind-approval" }, "approval"),
    h("strong", null, approval.tool_name),
    " ",
    h("span", { class: "note" }, `call ${approval.call_id} of run ${approval.run_id}`),
    approval.arguments !== undefined
      ? h("pre", { class: "arguments" }, JSON.stringify(approval.arguments, null, 2))
      : h("div", { class: "hidden-content" }, "arguments hidden (the key lacks read_content)"),
    approval.reason ? h("div", { class: "note" }, approval.reason) : null,
    canDecide
      ? h(
          "div",
          { class: "decide" },
          h("button", { class: "approve", type: "button", "data-testid": "approve", onclick: act("approve") }, "Approve"),
          reason,
          h("button", { class: "reject", type: "button", "data-testid": "reject", onclick: act("reject") }, "Reject"),
          message,
        )
      : h("div", { class: "note", "data-testid": "no-approve-scope" }, "Waiting for a decision by a key with the approve scope."),
  );
  return item;
}

function showApprovals(view: RunView, result: RunResult, refresh: () => void): void {
  const pending = result.pending_approvals ?? [];
  if (!pending.length) {
    replace(view.approvals);
    return;
  }
  replace(
    view.approvals,
    h("h3", null, "Waiting for approval"),
    h("ul", { class: "approvals", "data-testid": "approvals" }, pending.map((approval) => approvalItem(view, approval, refresh))),
  );
}

async function load(view: RunView, refresh: () => void): Promise<void> {
  const [result, trace] = await Promise.all([
    call<RunResult>(`${path(view)}?${query(view)}`),
    call<Trace>(`/v1/traces/${encodeURIComponent(view.runId)}?${query(view)}`),
  ]);
  showSummary(view, result, trace);
  showApprovals(view, result, refresh);
  replace(view.tree, h("ul", { class: "tree root", "data-testid": "tree" }, build(trace).map((node) => render(node, trace.content))));
}

function eventItem(event: StreamEvent): HTMLLIElement {
  let type = event.event;
  let detail = "";
  try {
    const data = JSON.parse(event.data);
    if (event.event === "error") detail = data?.error?.message ?? "";
    else detail = [when(data.ts), data.run_id ? `run ${String(data.run_id).slice(0, 8)}…` : ""].filter(Boolean).join(" · ");
    type = data.type ?? type;
  } catch {
    detail = event.data.slice(0, 120);
  }
  return h(
    "li",
    { class: `event ${event.event === "error" ? "error" : ""}`, "data-type": type },
    h("span", { class: "seq" }, event.id ?? ""),
    h("span", { class: "type" }, type),
    h("span", { class: "note" }, detail),
  );
}

async function follow(view: RunView, refresh: () => void): Promise<void> {
  view.live.textContent = "● live";
  view.live.className = "live on";
  try {
    await stream(`${path(view, "/events")}?${query(view)}`, view.signal, (event) => {
      view.events.appendChild(eventItem(event));
      refresh();
    });
    view.live.textContent = "stream ended";
  } catch (error) {
    if (view.signal.aborted) return;
    view.live.textContent = `stream failed: ${error instanceof ApiFailure || error instanceof Error ? error.message : String(error)}`;
  }
  view.live.className = "live off";
  refresh();
}

/** Shows the run `runId` of `session` in `root`, live until `signal` aborts. */
export async function showRun(root: HTMLElement, session: string, runId: string, who: WhoAmI, signal: AbortSignal): Promise<void> {
  const view: RunView = {
    session,
    runId,
    who,
    summary: h("div", { class: "summary", "data-testid": "summary" }),
    approvals: h("section", { class: "approvals-panel" }),
    tree: h("div", { class: "tree-panel" }),
    events: h("ol", { class: "events", "data-testid": "events" }),
    live: h("span", { class: "live", "data-testid": "live" }),
    signal,
  };
  replace(
    root,
    h("p", null, h("a", { href: hashOf({ agent: "", status: "", session: "" }) }, "← all runs"), " · ", h("a", { href: hashOf({ agent: "", status: "", session }) }, `session ${session}`)),
    h("h2", null, "Run ", h("code", { "data-testid": "run-id" }, runId)),
    view.summary,
    view.approvals,
    h("div", { class: "columns" }, h("section", null, h("h3", null, "Steps"), view.tree), h("section", null, h("h3", null, "Events ", view.live), view.events)),
  );
  // Refreshes are coalesced: a burst of events makes one reload of the result and the trace.
  let pending = false;
  let again = false;
  const refresh = () => {
    if (signal.aborted) return;
    if (pending) {
      again = true;
      return;
    }
    pending = true;
    setTimeout(() => {
      load(view, refresh)
        .catch((error) => replace(view.tree, h("div", { class: "banner error" }, error instanceof Error ? error.message : String(error))))
        .finally(() => {
          pending = false;
          if (again) {
            again = false;
            refresh();
          }
        });
    }, 100);
  };
  await load(view, refresh);
  if (!signal.aborted) void follow(view, refresh);
}
