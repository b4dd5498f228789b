// A run's trace as a tree of steps: runs, steps, model calls, tool calls, sub-runs, judges,
// guards and approvals, each with its timing, tokens and cost.

import { h, cost, duration, type Child } from "./dom";
import type { Span, SpanEvent, Trace } from "./types";

/** A span and the spans under it. */
export interface Node {
  span: Span;
  children: Node[];
}

/** The spans of `trace` as trees (each span under its parent; orphans are roots). */
export function build(trace: Trace): Node[] {
  const nodes = new Map<string, Node>();
  for (const span of trace.spans) nodes.set(span.span_id, { span, children: [] });
  const roots: Node[] = [];
  for (const node of nodes.values()) {
    const parent = node.span.parent_span_id ? nodes.get(node.span.parent_span_id) : undefined;
    if (parent) parent.children.push(node);
    else roots.push(node);
  }
  return roots;
}

const KIND_LABELS: Record<string, string> = {
  run: "run",
  step: "step",
  chat: "model call",
  tool: "tool call",
  judge: "judge",
  model: "model call",
  other: "event",
};

/** What a node stands for, for people: a sub-run is a run under another run's tool call. */
function label(node: Node, depth: number): string {
  const { kind, name } = node.span;
  if (kind === "run" && depth > 0) return "sub-run";
  if (kind === "other" && name.startsWith("approval")) return "approval";
  if (kind === "other" && (name.startsWith("guard") || name.startsWith("policy"))) return "guard";
  return KIND_LABELS[kind] ?? kind;
}

function numberOf(span: Span, key: string): number | undefined {
  const value = span.attributes[key];
  return typeof value === "number" ? value : undefined;
}

/** Tokens of a node: its own, else the sum of its children's model calls. */
function tokens(node: Node): { input: number; output: number } | null {
  const input = numberOf(node.span, "gen_ai.usage.input_tokens");
  const output = numberOf(node.span, "gen_ai.usage.output_tokens");
  if (input !== undefined || output !== undefined) return { input: input ?? 0, output: output ?? 0 };
  const sum = { input: 0, output: 0 };
  let found = false;
  for (const child of node.children) {
    const inner = tokens(child);
    if (inner) {
      found = true;
      sum.input += inner.input;
      sum.output += inner.output;
    }
  }
  return found ? sum : null;
}

/** Content attributes: what a key without `read_content` does not get. */
const CONTENT_KEYS = [
  "gen_ai.input.messages",
  "gen_ai.output.messages",
  "gen_ai.tool.call.arguments",
  "gen_ai.tool.call.result",
  "loom.message",
  "loom.arguments",
  "loom.reason",
  "loom.output",
  "loom.error",
];

function show(value: unknown): string {
  if (typeof value === "string") return value;
  return JSON.stringify(value, null, 2);
}

function details(span: Span, content: boolean): Child {
  const shown = CONTENT_KEYS.filter((key) => key in span.attributes);
  const rows: Child[] = shown.map((key) =>
    h("div", { class: "content" }, h("span", { class: "attr" }, key), h("pre", null, show(span.attributes[key]))),
  );
  if (!content && ["chat", "tool", "run", "judge", "model"].includes(span.kind)) {
    rows.push(h("div", { class: "hidden-content", "data-testid": "hidden-content" }, "content hidden (the key lacks read_content)"));
  }
  const other = Object.entries(span.attributes).filter(([key]) => !CONTENT_KEYS.includes(key));
  const table = h(
    "table",
    { class: "attrs" },
    other.map(([key, value]) => h("tr", null, h("td", { class: "attr" }, key), h("td", null, show(value)))),
  );
  return h("details", { class: "node-details" }, h("summary", null, "details"), rows, table);
}

function spanEvent(event: SpanEvent): Child {
  const attrs = event.attributes ?? {};
  const facts = ["loom.decision", "loom.policy", "loom.guard", "loom.tool", "loom.passed", "loom.by", "loom.outcome"]
    .filter((key) => key in attrs)
    .map((key) => `${key.replace("loom.", "")}: ${show(attrs[key])}`);
  const kind = event.name.startsWith("approval") ? "approval" : event.name.startsWith("policy") || event.name.startsWith("guard") ? "guard" : "event";
  return h(
    "li",
    { class: `span-event ev-${kind}`, "data-kind": kind },
    h("span", { class: `kind kind-${kind}` }, kind),
    h("span", { class: "name" }, event.name),
    facts.length ? h("span", { class: "facts" }, facts.join(" · ")) : null,
  );
}

/** One node and its subtree, as a list item (`depth`: how many runs are above it). */
export function render(node: Node, content: boolean, depth = 0): HTMLLIElement {
  const { span } = node;
  const kind = label(node, depth);
  const used = tokens(node);
  const spent = numberOf(span, "loom.cost_usd");
  const open = !span.end_time;
  const item = h(
    "li",
    { class: `node span-${span.kind} span-status-${span.status}`, "data-kind": kind, "data-span-id": span.span_id, "data-run-id": span.run_id },
    h(
      "div",
      { class: "node-line" },
      h("span", { class: `kind kind-${kind.replace(/ /g, "-")}` }, kind),
      h("span", { class: "name" }, span.name),
      h("span", { class: `status status-${span.status}` }, open ? (kind === "approval" ? "waiting" : "running") : span.status),
      h("span", { class: "metric time", title: "duration" }, open ? "…" : duration(span.duration_ms)),
      used ? h("span", { class: "metric tokens", title: "input / output tokens" }, `${used.input} → ${used.output} tok`) : null,
      spent !== undefined ? h("span", { class: "metric cost", title: "cost" }, cost(spent)) : null,
    ),
    details(span, content),
  );
  if (span.events?.length) item.appendChild(h("ul", { class: "span-events" }, span.events.map(spanEvent)));
  if (node.children.length) {
    item.appendChild(h("ul", { class: "tree" }, node.children.map((child) => render(child, content, depth + (span.kind === "run" ? 1 : 0)))));
  }
  return item;
}
