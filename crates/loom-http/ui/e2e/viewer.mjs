// The trace viewer in a real browser (Debian's Chromium, headless, driven by playwright-core)
// against a real `loom serve`: started by crates/loom-cli/tests/ui.rs, which seeds the runs and
// passes their ids in the environment. Each step prints `ok <step>`; any failed check exits
// non-zero with its message. Screenshots go to LOOM_UI_SCREENSHOTS.
//
// Environment: LOOM_UI_URL (the page, `http://host:port/ui/`), LOOM_UI_CHROMIUM, LOOM_UI_SCREENSHOTS,
// LOOM_UI_ADMIN_KEY (run, read, read_content, approve), LOOM_UI_READER_KEY (read only),
// LOOM_UI_RELEVES_DIR (where the equipe example's bank tool waits for its statement),
// LOOM_UI_SOLDE (`<session>/<run>`: a finished run with sub-runs), LOOM_UI_APPROVE and
// LOOM_UI_PAUSED (`<session>/<run>`: two runs waiting for an approval).

import assert from "node:assert/strict";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const url = env("LOOM_UI_URL");
const shots = env("LOOM_UI_SCREENSHOTS");
const adminKey = env("LOOM_UI_ADMIN_KEY");
const readerKey = env("LOOM_UI_READER_KEY");
const relevesDir = env("LOOM_UI_RELEVES_DIR");
const [soldeSession, soldeRun] = env("LOOM_UI_SOLDE").split("/");
const [approveSession, approveRun] = env("LOOM_UI_APPROVE").split("/");
const [pausedSession, pausedRun] = env("LOOM_UI_PAUSED").split("/");
const PATIENCE = 30_000;

const browser = await chromium.launch({
  executablePath: env("LOOM_UI_CHROMIUM"),
  headless: true,
  // The flags that keep Chromium off the network it would reach on its own (updates, sync…).
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});

const pages = [];

/** A page in a fresh context (its own sessionStorage), failing on any script error. */
async function open(key) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  page.setDefaultTimeout(PATIENCE);
  const errors = [];
  page.on("pageerror", (error) => errors.push(`page error: ${error.message}`));
  page.on("console", (message) => {
    // Failed requests are reported with their address below.
    if (message.type() === "error" && !message.text().startsWith("Failed to load resource")) errors.push(`console error: ${message.text()}`);
  });
  page.on("response", (response) => {
    // The first look-up of the key, before it is typed, is a 401: expected.
    const expected = response.status() === 401 && response.url().endsWith("/ui/whoami");
    if (response.status() >= 400 && !expected) errors.push(`${response.status()} on ${response.request().method()} ${response.url()}`);
  });
  page.errors = errors;
  pages.push(page);
  await page.goto(url);
  await page.getByTestId("key-input").fill(key);
  await page.getByTestId("key-submit").click();
  await page.getByTestId("scopes").waitFor();
  return page;
}

async function shot(page, name) {
  const path = join(shots, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  console.log(`screenshot ${path}`);
}

function noErrors(page) {
  assert.deepEqual(page.errors, [], "the page logged errors");
}

const runLink = (session, run) => `${url}#/run/${encodeURIComponent(session)}/${encodeURIComponent(run)}`;

try {
  // 1. The runs list, with its filters.
  const admin = await open(adminKey);
  assert.equal(await admin.getByTestId("scopes").textContent(), "run, read, read_content, approve");
  await admin.getByTestId("runs").waitFor();
  for (const run of [soldeRun, approveRun, pausedRun]) {
    assert.equal(await admin.locator(`tr[data-run-id="${run}"]`).count(), 1, `run ${run} is listed`);
  }
  const subRuns = admin.locator("tr.run:not(.depth-0)");
  assert.ok((await subRuns.count()) >= 3, "the sub-runs are listed under their parents");
  await shot(admin, "runs-list");
  await admin.getByTestId("filter-status").selectOption("paused");
  await admin.getByRole("button", { name: "Apply" }).click();
  await admin.waitForFunction(() => location.hash.includes("status=paused"));
  await admin.locator(`tr[data-run-id="${soldeRun}"]`).waitFor({ state: "detached" });
  const statuses = await admin.locator("tr.run").evaluateAll((rows) => rows.map((row) => row.dataset.status));
  assert.ok(statuses.length >= 2 && statuses.every((status) => status === "paused"), `only paused runs: ${statuses}`);
  await admin.getByTestId("filter-status").selectOption("");
  await admin.getByTestId("filter-agent").selectOption("secretariat");
  await admin.getByTestId("filter-session").fill(soldeSession);
  await admin.getByRole("button", { name: "Apply" }).click();
  await admin.waitForFunction(() => location.hash.includes("agent=secretariat"));
  await admin.locator(`tr[data-run-id="${soldeRun}"]`).waitFor();
  await admin.waitForFunction(() => document.querySelectorAll("tr.run").length === 1);
  const rows = await admin.locator("tr.run").evaluateAll((rows) => rows.map((row) => row.dataset.runId));
  assert.deepEqual(rows, [soldeRun], "agent and session filters");
  console.log("ok runs list and filters");

  // 2. A run's tree: sub-runs, model calls, tool calls, with timings, tokens and cost.
  await admin.locator(`tr[data-run-id="${soldeRun}"] a`).first().click();
  await admin.getByTestId("tree").waitFor();
  await admin.waitForFunction(() => document.querySelector('[data-testid="live"]')?.textContent === "stream ended");
  assert.equal(await admin.getByTestId("run-status").textContent(), "completed");
  for (const kind of ["run", "sub-run", "step", "model call", "tool call"]) {
    assert.ok((await admin.locator(`li.node[data-kind="${kind}"]`).count()) > 0, `a ${kind} node`);
  }
  const subRun = admin.locator('li.node[data-kind="sub-run"]').first();
  assert.match(await subRun.locator(".node-line .tokens").first().textContent(), /^\d+ → \d+ tok$/);
  assert.match(await admin.locator('li.node[data-kind="model call"] .node-line .time').first().textContent(), /ms|s$/);
  assert.match(await admin.locator('li.node[data-kind="model call"] .node-line .cost').first().textContent(), /^(\$|<\$)/);
  assert.match(await admin.getByTestId("answer").textContent(), /Réponse du service comptable/);
  assert.ok((await admin.locator('ol.events li[data-type="run.completed"]').count()) >= 1, "the events are listed");
  await admin.locator('li.node[data-kind="tool call"] details').first().evaluate((d) => (d.open = true));
  await shot(admin, "run-tree");
  console.log("ok run tree");

  // 3. A run followed live: the bank tool waits for its statement, the page shows it running,
  // then the statement arrives and the page follows the run to its end without a reload.
  const answer = await fetch(new URL("../v1/agents/secretariat/runs", url), {
    method: "POST",
    headers: { Authorization: `Bearer ${adminKey}`, "Content-Type": "application/json" },
    body: JSON.stringify({ message: "Peux-tu récupérer le relevé bancaire du mois ?", session_id: "releve-live", background: true }),
  });
  const accepted = await answer.text();
  assert.equal(answer.status, 202, accepted);
  const live = JSON.parse(accepted);
  await admin.goto(runLink("releve-live", live.run_id));
  await admin.getByTestId("tree").waitFor();
  await admin.waitForFunction(() => document.querySelector('[data-testid="live"]')?.textContent === "● live");
  const asked = join(relevesDir, "demande-cic.txt");
  const deadline = Date.now() + PATIENCE;
  while (!existsSync(asked)) {
    assert.ok(Date.now() < deadline, `the bank tool never asked (${asked})`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  await admin.locator('li.node[data-kind="tool call"] .status', { hasText: "running" }).first().waitFor();
  assert.notEqual(await admin.getByTestId("run-status").textContent(), "completed");
  const before = await admin.locator("ol.events li").count();
  await shot(admin, "live-running");
  writeFileSync(join(relevesDir, "releve-cic.txt"), "Relevé CIC : solde 12 480,50 €\n");
  await admin.waitForFunction(() => document.querySelector('[data-testid="run-status"]')?.textContent === "completed");
  await admin.waitForFunction(() => document.querySelector('[data-testid="live"]')?.textContent === "stream ended");
  const after = await admin.locator("ol.events li").count();
  assert.ok(after > before, `events arrived live (${before} then ${after})`);
  assert.match(await admin.getByTestId("answer").textContent(), /Relevé CIC/);
  await shot(admin, "live-completed");
  console.log("ok live run");

  // 4. Approve: the paused run shows its waiting call with the buttons; approving resumes it.
  await admin.goto(runLink(approveSession, approveRun));
  await admin.getByTestId("approvals").waitFor();
  assert.match(await admin.locator("li.approval").first().textContent(), /virement/);
  assert.match(await admin.locator("li.approval pre.arguments").first().textContent(), /FR7630004000010000000000123/);
  await shot(admin, "approval-waiting");
  await admin.getByTestId("approve").first().click();
  await admin.waitForFunction(() => document.querySelector('[data-testid="run-status"]')?.textContent === "completed");
  await admin.getByTestId("approvals").waitFor({ state: "detached" });
  assert.ok((await admin.locator('ol.events li[data-type="approval.granted"]').count()) >= 1, "approval.granted streamed");
  assert.ok((await admin.locator('li.node[data-kind="approval"], li.span-event[data-kind="approval"]').count()) >= 1, "the approval is in the tree");
  await shot(admin, "approval-done");
  noErrors(admin);
  console.log("ok approve");

  // 5. A key without read_content (nor approve): the page says content is hidden, shows none.
  const reader = await open(readerKey);
  assert.equal(await reader.getByTestId("scopes").textContent(), "read");
  await reader.goto(runLink(soldeSession, soldeRun));
  await reader.getByTestId("tree").waitFor();
  await reader.getByTestId("content-hidden").waitFor();
  assert.equal(await reader.getByTestId("answer").count(), 0, "no answer without read_content");
  assert.ok((await reader.getByTestId("hidden-content").count()) > 0, "nodes say their content is hidden");
  assert.ok((await reader.locator('li.node[data-kind="sub-run"]').count()) > 0, "the tree is still there");
  const body = await reader.locator("body").textContent();
  assert.ok(!body.includes("Réponse du service comptable"), "no answer text anywhere");
  assert.ok(!body.includes("12 480,50") && !body.includes("12\u202f480,50"), "no tool result anywhere");
  await shot(reader, "reader-run");
  await reader.goto(runLink(pausedSession, pausedRun));
  await reader.getByTestId("approvals").waitFor();
  assert.equal(await reader.getByTestId("approve").count(), 0, "no approve button without the approve scope");
  await reader.getByTestId("no-approve-scope").waitFor();
  assert.ok(!(await reader.locator("body").textContent()).includes("FR7630004000010000000000123"), "no arguments");
  await shot(reader, "reader-approval");
  noErrors(reader);
  console.log("ok no read_content");
} catch (error) {
  // What each page showed when the check failed, for the person reading the failure.
  for (const [index, page] of pages.entries()) {
    await shot(page, `failure-${index}`).catch(() => {});
    console.log(`page ${index} at ${page.url()}: ${page.errors.join("; ")}`);
    console.log((await page.locator("main").textContent().catch(() => "")).slice(0, 2000));
  }
  throw error;
} finally {
  await browser.close();
}
