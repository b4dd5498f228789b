// The Loom trace viewer: asks for an API key (kept in this tab only), checks it with
// `<base_path>/ui/whoami`, then shows the runs list or a run's page after the hash
// (`#/runs?…`, `#/run/<session>/<run>`).

import { ApiFailure, BASE, call, storeKey, storedKey } from "./api";
import { h, replace } from "./dom";
import { showRun } from "./run";
import { filtersOf, showRuns } from "./runs";
import type { WhoAmI } from "./types";

const main = document.getElementById("main") as HTMLElement;
const account = document.getElementById("account") as HTMLElement;
let current: AbortController | null = null;
let who: WhoAmI | null = null;

function keyForm(message: string): void {
  account.textContent = "";
  const input = h("input", { type: "password", name: "key", autocomplete: "off", placeholder: "lk_…", "data-testid": "key-input", size: 40 });
  const form = h(
    "form",
    { class: "key-form", "data-testid": "key-form" },
    h("h2", null, "API key"),
    h("p", null, "The viewer reads the API with your key (Authorization: Bearer). It is kept in this tab only."),
    message ? h("p", { class: "banner error", "data-testid": "key-error" }, message) : null,
    input,
    h("button", { type: "submit", "data-testid": "key-submit" }, "Open"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    storeKey(input.value.trim() || null);
    void start();
  });
  replace(main, form);
  input.focus();
}

function showAccount(me: WhoAmI): void {
  const forget = h("button", { type: "button", class: "link", "data-testid": "change-key" }, "change key");
  forget.addEventListener("click", () => {
    storeKey(null);
    who = null;
    keyForm("");
  });
  replace(
    account,
    me.open ? "open API (no keys)" : `key ${me.key ?? ""}`,
    ` · tenant ${me.tenant} · scopes `,
    h("span", { "data-testid": "scopes" }, me.scopes.join(", ")),
    me.open ? null : [" · ", forget],
  );
}

async function route(): Promise<void> {
  if (!who) return;
  current?.abort();
  current = new AbortController();
  const hash = location.hash.replace(/^#/, "") || "/runs";
  const [path, search] = hash.split("?", 2);
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const signal = current.signal;
  try {
    if (parts[0] === "run" && parts.length === 3) {
      await showRun(main, parts[1], parts[2], who, signal);
    } else {
      await showRuns(main, filtersOf(new URLSearchParams(search ?? "")), signal);
    }
  } catch (error) {
    if (signal.aborted) return;
    if (error instanceof ApiFailure && error.status === 401) {
      keyForm(error.message);
      return;
    }
    replace(main, h("div", { class: "banner error", "data-testid": "error" }, error instanceof Error ? error.message : String(error)));
  }
}

async function start(): Promise<void> {
  try {
    who = await call<WhoAmI>("/ui/whoami");
  } catch (error) {
    who = null;
    const message = error instanceof Error ? error.message : String(error);
    keyForm(storedKey() ? message : "");
    return;
  }
  showAccount(who);
  await route();
}

window.addEventListener("hashchange", () => void route());
document.title = `Loom traces — ${location.host}${BASE}`;
void start();
