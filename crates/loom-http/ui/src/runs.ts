// The runs list (`#/runs?agent=…&status=…&session=…`): `GET /v1/runs` with the agent and
// status filters, the session filter applied to the page of runs it answers.

import { call } from "./api";
import { cost, h, replace, when } from "./dom";
import { RUN_STATUSES, type Agent, type RunListed, type RunPage } from "./types";

/** The filters of the list, as the hash carries them. */
export interface Filters {
  agent: string;
  status: string;
  session: string;
}

/** The filters in `query` (the hash's query string). */
export function filtersOf(query: URLSearchParams): Filters {
  return { agent: query.get("agent") ?? "", status: query.get("status") ?? "", session: query.get("session") ?? "" };
}

/** The hash of the list with `filters`. */
export function hashOf(filters: Filters): string {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(filters)) if (value) query.set(name, value);
  const text = query.toString();
  return text ? `#/runs?${text}` : "#/runs";
}

/** The address of a run's page. */
export function runHash(run: { session_id: string; run_id: string }): string {
  return `#/run/${encodeURIComponent(run.session_id)}/${encodeURIComponent(run.run_id)}`;
}

function select(name: string, label: string, values: string[], current: string): HTMLLabelElement {
  return h(
    "label",
    null,
    label,
    h(
      "select",
      { name, "data-testid": `filter-${name}` },
      h("option", { value: "" }, "any"),
      values.map((value) => h("option", { value, selected: value === current }, value)),
    ),
  );
}

function row(run: RunListed): HTMLTableRowElement {
  const usage = run.usage ?? {};
  return h(
    "tr",
    { class: `run depth-${Math.min(run.depth, 4)}`, "data-run-id": run.run_id, "data-status": run.status },
    h("td", null, when(run.started_at)),
    h(
      "td",
      { class: "run-id" },
      run.depth > 0 ? h("span", { class: "sub", title: `sub-run of ${run.parent_run_id ?? ""}` }, "↳ ") : null,
      h("a", { href: runHash(run) }, run.run_id),
    ),
    h("td", null, run.agent),
    h("td", null, h("span", { class: `status status-${run.status}` }, run.status)),
    h("td", { class: "session" }, h("a", { href: hashOf({ agent: "", status: "", session: run.session_id }) }, run.session_id)),
    h("td", { class: "num" }, String(run.iterations)),
    h("td", { class: "num" }, `${usage.input_tokens ?? 0} → ${usage.output_tokens ?? 0}`),
    h("td", { class: "num" }, cost(run.cost_usd)),
  );
}

/** Shows the runs list with `filters` in `root`, unless `signal` aborted meanwhile (the person
 * went elsewhere before the answers came). */
export async function showRuns(root: HTMLElement, filters: Filters, signal: AbortSignal): Promise<void> {
  const agents = await call<Agent[]>("/v1/agents");
  const form = h(
    "form",
    { class: "filters", "data-testid": "filters" },
    select("agent", "Agent", agents.map((agent) => agent.name), filters.agent),
    select("status", "Status", RUN_STATUSES, filters.status),
    h("label", null, "Session", h("input", { name: "session", value: filters.session, placeholder: "any", "data-testid": "filter-session" })),
    h("button", { type: "submit" }, "Apply"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const next = hashOf({
      agent: String(data.get("agent") ?? ""),
      status: String(data.get("status") ?? ""),
      session: String(data.get("session") ?? "").trim(),
    });
    if (location.hash === next) window.dispatchEvent(new HashChangeEvent("hashchange"));
    else location.hash = next;
  });
  const query = new URLSearchParams({ limit: "200", sessions: "200" });
  if (filters.agent) query.set("agent", filters.agent);
  if (filters.status) query.set("status", filters.status);
  const page = await call<RunPage>(`/v1/runs?${query}`);
  if (signal.aborted) return;
  const runs = filters.session ? page.runs.filter((run) => run.session_id === filters.session) : page.runs;
  const table = runs.length
    ? h(
        "table",
        { class: "runs", "data-testid": "runs" },
        h(
          "thead",
          null,
          h("tr", null, ["Started", "Run", "Agent", "Status", "Session", "Model calls", "Tokens (in → out)", "Cost"].map((title) => h("th", null, title))),
        ),
        h("tbody", null, runs.map(row)),
      )
    : h("p", { class: "empty", "data-testid": "no-runs" }, "No run matches these filters.");
  replace(
    root,
    h("h2", null, "Runs"),
    form,
    table,
    h(
      "p",
      { class: "note" },
      `${runs.length} run(s) from the ${page.scanned} most recently written session(s)`,
      page.truncated ? " — more exist: narrow the filters." : ".",
    ),
  );
}
