// Drives Debian's chromium through the dashboard of a running `allot up` (tests/e2e/dashboard.rs
// starts it, submits the load and checks what this prints). Each step is bounded in time; the
// first that fails prints why and exits 1. Screenshots go to ALLOT_SHOTS.
//
//   ALLOT_URL=http://127.0.0.1:PORT ALLOT_TOKEN=... ALLOT_MEMBER_TOKEN=... ALLOT_MEMBER_TEAM=nlp \
//   ALLOT_SHOTS=dir [ALLOT_CHROMIUM=/usr/bin/chromium] node dashboard.mjs
//
// Prints one JSON object: what the page showed at each step.
import { chromium } from "playwright-core";
import { join } from "node:path";

const url = need("ALLOT_URL").replace(/\/+$/, "");
const token = need("ALLOT_TOKEN");
const memberToken = need("ALLOT_MEMBER_TOKEN");
const memberTeam = need("ALLOT_MEMBER_TEAM");
const shots = need("ALLOT_SHOTS");

function need(name) {
  const v = process.env[name];
  if (!v) fail(`${name} is not set`);
  return v;
}

function fail(why) {
  console.error(`dashboard.mjs: ${why}`);
  process.exit(1);
}

const report = {};
let current = null; // the page a failing step screenshots
// The machine's network is closed: no background fetches, no component updates, no sign-in.
const browser = await chromium.launch({
  executablePath: process.env.ALLOT_CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  timeout: 60_000,
});
process.on("exit", () => browser.close().catch(() => {}));

try {
  // UTC, so the look-back field's local time is the journal's time.
  const context = await browser.newContext({ timezoneId: "UTC", viewport: { width: 1400, height: 1000 } });
  const page = await context.newPage();
  current = page;
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(`${url}/#token=${token}`);

  // 1. Nodes, GPUs and the SSE connection appear.
  await step("the cluster map shows every GPU and the live badge", () =>
    page.waitForFunction(() => document.querySelectorAll("#cluster .gpu").length > 0
      && document.querySelector("#live").textContent === "live", null, { timeout: 60_000 }));
  report.nodes = await page.$$eval("#cluster .node", (ns) => ns.map((n) => n.dataset.node));
  report.gpus = await page.$$eval("#cluster .gpu", (gs) => gs.length);

  // 2. Work appears: a queue with reasons and ETAs, and running allocations on the map.
  await step("the queue and the running table fill", () =>
    page.waitForFunction(() => document.querySelectorAll("#queue tbody tr[data-task]").length > 0
      && document.querySelectorAll("#running tbody tr td:nth-child(3)").length > 0
      && document.querySelectorAll("#cluster .gpu.busy").length > 0, null, { timeout: 90_000 }));
  const first = await view(page);
  report.first = first;
  // A moment the first task seen running certainly ran at: two seconds after its grant, as the
  // decision log has it (the page's view may be a refresh old, so not "now"; the tasks run six).
  const task = await page.$eval("#running tbody tr[data-task]", (r) => r.dataset.task);
  const granted = await page.evaluate(async ([task, token]) => {
    const r = await fetch("/api/v1/decisions?task=" + task, { headers: { Authorization: "Bearer " + token } });
    return (await r.json()).items.find((d) => d.kind === "granted");
  }, [task, token]);
  if (!granted) fail(`no grant of task ${task} in the decision log`);
  report.first_at = new Date(granted.at_ms + 2000).toISOString();

  await page.screenshot({ path: join(shots, "1-live.png"), fullPage: true });

  // 3. It changes live, without a reload: other tasks run, the queue moves, events arrive.
  const loads = await page.evaluate(() => performance.getEntriesByType("navigation").length);
  await step("the running tasks and the queue change live", () =>
    page.waitForFunction((before) => {
      const running = [...document.querySelectorAll("#running tbody tr")].map((r) => r.cells[0].textContent).sort().join(",");
      const queue = [...document.querySelectorAll("#queue tbody tr[data-task]")].map((r) => r.dataset.task).join(",");
      return running !== before.running && queue !== before.queue;
    }, first, { timeout: 120_000 }));
  // The changes behind it reach the page as SSE events too, a little later: the views above
  // come from the allocators' journals, which the gateway follows as they grow, and the events
  // from its change log, which its read models write as they commit (every 200 ms at most).
  await step("the change log's events reach the page", () =>
    page.waitForFunction(() => document.querySelectorAll("#events li").length > 0, null, { timeout: 60_000 }));
  report.later = await view(page);
  report.events = await page.$$eval("#events li", (ls) => ls.length);
  report.reloaded = (await page.evaluate(() => performance.getEntriesByType("navigation").length)) !== loads;
  await page.screenshot({ path: join(shots, "2-live-later.png"), fullPage: true });

  // 4. Look back to when the first view held: the map and tables as they were then.
  const at = report.first_at.slice(0, 19);
  await page.fill("#lookback-at", at);
  await page.click("#lookback-go");
  await step("the look-back view shows", () =>
    page.waitForFunction(() => document.querySelector("#mode").textContent.startsWith("as it was at"),
      null, { timeout: 30_000 }));
  report.lookback_at = at;
  report.lookback = await view(page);
  report.lookback_mode = await page.textContent("#mode");
  report.lookback_api = await page.evaluate(async ([token, at]) => {
    const r = await fetch("/api/v1/lookback?at=" + at + "Z", { headers: { Authorization: "Bearer " + token } });
    return (await r.json()).allocations.map((a) => a.workload + "/" + a.task).sort().join(",");
  }, [token, at]);
  report.live_only_hidden = await page.isHidden("#live-only");
  await page.screenshot({ path: join(shots, "3-lookback.png"), fullPage: true });
  await page.click("#lookback-live");
  await step("back to live", () =>
    page.waitForFunction(() => document.querySelector("#mode").textContent === "live", null, { timeout: 30_000 }));
  report.page_errors = errors;
  await context.close();

  // 5. A member's token shows only its own team's work.
  const member = await browser.newContext({ timezoneId: "UTC", viewport: { width: 1400, height: 1000 } });
  const mpage = await member.newPage();
  current = mpage;
  await mpage.goto(`${url}/#token=${memberToken}`);
  await step("the member's view loads", () =>
    mpage.waitForFunction(() => document.querySelectorAll("#workloads tbody tr[data-workload]").length > 0
      && document.querySelectorAll("#cluster .gpu").length > 0, null, { timeout: 60_000 }));
  report.member_team = memberTeam;
  report.member = {
    workload_teams: await mpage.$$eval("#workloads tbody tr[data-workload]", (rs) => rs.map((r) => r.cells[1].textContent)),
    queue_teams: await mpage.$$eval("#queue tbody tr[data-task]", (rs) => rs.map((r) => r.cells[2].textContent)),
    running_teams: await mpage.$$eval("#running tbody tr", (rs) => rs.filter((r) => r.cells.length > 1).map((r) => r.cells[1].textContent)),
    cost_teams: await mpage.$$eval("#costs tbody tr", (rs) => rs.filter((r) => r.cells.length > 1).map((r) => r.cells[0].textContent)),
    gpu_titles: await mpage.$$eval("#cluster .gpu", (gs) => gs.map((g) => g.title)),
  };
  await mpage.screenshot({ path: join(shots, "4-member.png"), fullPage: true });
  await member.close();
} catch (e) {
  fail(String(e && e.stack || e));
}
console.log(JSON.stringify(report));
await browser.close();

async function step(what, action) {
  try {
    await action();
  } catch (e) {
    await current?.screenshot({ path: join(shots, "failed.png"), fullPage: true }).catch(() => {});
    const seen = await current?.evaluate(() => document.querySelector("main").innerText.slice(0, 4000)).catch(() => "");
    fail(`${what}: ${String(e && e.message || e)}\nthe page showed:\n${seen}`);
  }
}

async function view(page) {
  return page.evaluate(() => ({
    running: [...document.querySelectorAll("#running tbody tr")].filter((r) => r.cells.length > 1)
      .map((r) => r.cells[0].textContent).sort().join(","),
    queue: [...document.querySelectorAll("#queue tbody tr[data-task]")].map((r) => r.dataset.task).join(","),
    queue_reasons: [...document.querySelectorAll("#queue tbody tr[data-task]")].map((r) => r.cells[4].textContent),
    queue_etas: [...document.querySelectorAll("#queue tbody tr[data-task]")].map((r) => r.cells[5].textContent),
    busy_gpus: document.querySelectorAll("#cluster .gpu.busy").length,
    usage: document.querySelector("#usage").textContent,
  }));
}
