// The operator console (issue 24) in a real browser: Debian's chromium driven by playwright-core
// (test/testkit/browser.ts) against the whole local stack as a user runs it (`npm start`'s
// dist/src/stack/main.js: NATS, the API with the console, the admin issuer, two invocation and two
// grpc-proxy replicas, the callback proxy, and the compute agent with its local backend, which runs
// real instances and reports them, so that "instances going ready" is the plane's own doing).
// Everything a test looks at is what an operator sees: pages found by the ids and data- attributes of
// the console's contract, reached by links and forms, the login typed with the keyboard.
// Besides the pages and actions: a function's last hour drawn by uPlot after some invocations, the
// certificates (stack CA, each replica's) on the health page, a deploy through the console, and the
// callback proxy's access-log line of a request on the logs page.
// Screenshots of every page go to .callplane/test-output/console/ (1280x800, and one at 390x844).
// Addresses: services on 127.0.54.1, invocation replicas on 127.0.55.0/24, instances on
// 127.0.56.0/24, grpc-proxy replicas on 127.0.57.0/24 (no other test file uses them).
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import type { Page, Response as PageResponse } from "playwright-core";
import { request } from "undici";
import { startBrowser, testOutputDir, type TestBrowser } from "../testkit/browser.js";
import { waitFor } from "../testkit/client.js";
import { call, CLI_CLEAN_ENV, runCli, tmpDir } from "../testkit/index.js";
import { lifo } from "../testkit/proc.js";
import {
  runStack,
  waitStackReady,
  writeStackConfig,
  type StackJson,
  type StackRun,
} from "../testkit/stack.js";

const HOST = "127.0.54.1";
const ADDRESSES = {
  host: HOST,
  podNetwork: "127.0.55.0/24",
  grpcNetwork: "127.0.57.0/24",
  instanceNetwork: "127.0.56.0/24",
};

/** An admin token from the stack's issuer, as `callplane init` gets one (the operator credential). */
async function issuerToken(info: StackJson): Promise<string> {
  const credential = readFileSync(info.issuerCredentialFile, "utf8").trim();
  const r = await call<{ value: string }>(`${info.issuer}/v1/admin/keys`, { body: {}, token: credential });
  assert.equal(r.status, 200, r.text);
  return r.body.value;
}

/** The attributes of every element `selector` matches, in page order. */
async function rowsOf(page: Page, selector: string): Promise<Array<Record<string, string>>> {
  // runs in the page (this project compiles without the DOM's types: the shape it reads is spelled out)
  return await page.$$eval(
    selector,
    (els: Array<{ attributes: ArrayLike<{ name: string; value: string }> }>) =>
      els.map((e) => Object.fromEntries(Array.from(e.attributes, (a) => [a.name, a.value]))),
  );
}

/** The id of the element that has the keyboard's focus. */
const focusedId = (page: Page) =>
  page.evaluate<string | undefined>("document.activeElement ? document.activeElement.id : undefined");

/** Loads `url` again and again until `check` holds (pages are server-rendered; only the live page pushes). */
async function reloadUntil<T>(
  page: Page,
  url: string,
  what: string,
  check: () => Promise<T | undefined | false>,
  timeoutMs = 30_000,
): Promise<T> {
  return await waitFor(
    what,
    async () => {
      await page.goto(url);
      return await check();
    },
    { timeoutMs, intervalMs: 500 },
  );
}

/**
 * Logs in as a keyboard user does: Tab until the token field has focus, type the token, Enter.
 * Returns the answer to the form's POST (the page it leads to is loaded).
 */
async function logIn(page: Page, consoleUrl: string, token: string): Promise<PageResponse> {
  await page.goto(`${consoleUrl}/login`);
  for (let i = 0; i < 20; i++) {
    if ((await focusedId(page)) === "token") break;
    await page.keyboard.press("Tab");
  }
  assert.equal(await focusedId(page), "token", "the token field is reached with Tab");
  await page.keyboard.insertText(token);
  const posted = page.waitForResponse(
    (r) => r.request().method() === "POST" && new URL(r.url()).pathname === "/console/login",
  );
  // the document the POST leads to (the login page again when refused): waited for, so that the
  // next navigation does not race it
  const loaded = page.waitForEvent("load");
  await page.keyboard.press("Enter");
  const res = await posted;
  await loaded;
  return res;
}

const text = async (page: Page, selector = "body") => (await page.textContent(selector)) ?? "";

/** The error a console page shows (#error: its code and message), for failure messages. */
const shownError = async (page: Page) =>
  (await page.locator("#error").count()) ? ((await page.textContent("#error")) ?? "").trim() : "(no #error)";

test("the operator console, in Debian's chromium, against the local stack", async (t) => {
  const ctx = lifo(t);
  const dir = tmpDir(ctx, "callplane-console-");
  const cfg = await writeStackConfig(dir, ADDRESSES);
  let run: StackRun = runStack(ctx, dir, cfg.file);
  let info = await waitStackReady(run, cfg.dataDir);
  const consoleUrl = `${info.api}/console`;
  const outDir = testOutputDir("console");
  // this run's screenshots only: one left from an earlier run must not be taken for this one's
  rmSync(outDir, { recursive: true, force: true });
  const b: TestBrowser = await startBrowser(ctx, { allowHosts: [new URL(info.api).host], outDir });
  const { page } = b;
  const admin = await issuerToken(info);
  const cliEnv = (token: string): NodeJS.ProcessEnv => ({
    ...CLI_CLEAN_ENV,
    HOME: dir,
    CALLPLANE_STATE_DIR: join(dir, "cli-state"),
    CALLPLANE_API_URL: info.api,
    CALLPLANE_TOKEN: token,
  });
  const cli = async (args: string[], token = admin) => {
    const r = await runCli(args, { cwd: dir, env: cliEnv(token) });
    assert.equal(r.code, 0, `callplane ${args.join(" ")}:\n${r.stderr}${r.stdout}`);
    return r.stdout;
  };
  const shots: string[] = [];
  /** The invocation replicas' holder ids, as the health page names them. */
  let holders: string[] = [];
  const shot = async (name: string) => shots.push(await b.screenshot(name));

  await t.test("stack.json names the console", () => {
    assert.equal((info as StackJson & { console?: string }).console, `${consoleUrl}/`);
  });

  await t.test("without a token only the login page is served", async () => {
    for (const path of [
      "/health",
      "/functions",
      `/functions/${info.demo.httpFunctionId}`,
      "/live",
      "/audit",
    ]) {
      const res = await page.goto(`${consoleUrl}${path}`);
      assert.equal(new URL(page.url()).pathname, "/console/login", `${path} leads to the login page`);
      assert.equal(res?.status(), 200);
      assert.equal(await page.locator("form#login[method=post][action='/console/login']").count(), 1);
      assert.equal(await page.locator("input#token[name=token][type=password]").count(), 1);
      assert.equal(await page.locator("button#login-submit").count(), 1);
      const body = await text(page);
      for (const secret of [info.demo.httpFunctionName, info.demo.httpFunctionId, info.demo.slowFunctionId])
        assert.ok(!body.includes(secret), `the login page shows ${secret}`);
    }
    // it says how to get a token
    assert.match(await text(page), /callplane init/);
    await shot("login");
    // and by HTTP, as a script without a token sees it: a redirect and nothing else
    for (const path of ["", "/health", "/functions", "/live", "/audit", "/requests/x"]) {
      const r = await request(`${consoleUrl}${path}`, { method: "GET" });
      const body = await r.body.text();
      assert.equal(r.statusCode, 303, `GET /console${path}`);
      assert.match(String(r.headers.location), /^\/console\/(login|health)$/);
      assert.ok(!body.includes(info.demo.httpFunctionId));
    }
    const events = await request(`${consoleUrl}/live/events`, { method: "GET" });
    await events.body.text();
    assert.notEqual(events.statusCode, 200, "the live events need a token");
  });

  await t.test("a bad token is 401 TOKEN_INVALID on the login page", async () => {
    const res = await logIn(page, consoleUrl, "not-a-token");
    assert.equal(res.status(), 401, await shownError(page));
    assert.match(await text(page), /TOKEN_INVALID/);
    assert.equal(await page.locator("form#login").count(), 1);
  });

  await t.test("an API key is refused: 403 CONSOLE_ADMIN_REQUIRED, and no session", async () => {
    const res = await logIn(page, consoleUrl, info.demo.apiKey);
    assert.equal(res.status(), 403, await shownError(page));
    assert.match(await text(page), /CONSOLE_ADMIN_REQUIRED/);
    assert.ok(!(await text(page)).includes(info.demo.httpFunctionId));
    await page.goto(`${consoleUrl}/health`);
    assert.equal(new URL(page.url()).pathname, "/console/login", "no cookie was set for an API key");
    // and as a script sends it
    const r = await request(`${consoleUrl}/health`, {
      headers: { authorization: `Bearer ${info.demo.apiKey}` },
    });
    assert.equal(r.statusCode, 403);
    assert.match(await r.body.text(), /CONSOLE_ADMIN_REQUIRED/);
  });

  await t.test(
    "logged in with an admin token: the health page lists the API, database, NATS (each server, JetStream, the auth callout), the issuer, each replica, the callback proxy, the MEK provider",
    async () => {
      const res = await logIn(page, consoleUrl, admin);
      assert.ok(
        res.status() === 303 || res.status() === 200,
        `login answered ${res.status()}: ${await shownError(page)}`,
      );
      assert.equal(new URL(page.url()).pathname, "/console/health");
      const rows = await reloadUntil(
        page,
        `${consoleUrl}/health`,
        "both invocation replicas up",
        async () => {
          const r = await rowsOf(page, "table#components tr[data-component]");
          const up = r.filter((x) => x["data-component"] === "invocation" && x["data-state"] === "up");
          return up.length === 2 ? r : undefined;
        },
      );
      const of = (c: string) => rows.filter((r) => r["data-component"] === c);
      for (const c of ["api", "database", "nats"]) {
        assert.equal(of(c).length, 1, `one ${c} row`);
        assert.equal(of(c)[0]["data-state"], "up", `${c} is up`);
      }
      assert.equal(of("admin-issuer").length, 1, "the issuer is enabled: it has a row");
      holders = of("invocation").map((r) => r["data-id"]);
      assert.equal(new Set(holders).size, 2, "a row per invocation replica, by its holder id");
      assert.equal(of("grpc-proxy").length, 2, "a row per grpc-proxy replica");
      assert.ok(of("compute").length >= 1, "the local compute cluster has a row");
      // the parts the API asks itself: the callback proxy's /health on its admin listener, each
      // NATS server and the account's JetStream, the auth callout as NATS sees it, the MEK provider
      for (const c of ["callback-proxy", "jetstream", "mek-provider"]) {
        assert.equal(of(c).length, 1, `one ${c} row: ${JSON.stringify(rows)}`);
        assert.equal(of(c)[0]["data-state"], "up", `${c} is up: ${JSON.stringify(of(c))}`);
      }
      assert.match(
        await text(page, 'table#components tr[data-component="callback-proxy"]'),
        /http:\/\/[\d.]+:\d+\/health[\s\S]*\/health answered 200 in \d+ ms/,
      );
      assert.equal(of("mek-provider")[0]["data-id"], "file", "the stack's keyring file");
      assert.ok(of("nats-node").length >= 1, "a row per NATS server");
      for (const n of of("nats-node")) assert.equal(n["data-state"], "up", JSON.stringify(n));
      assert.ok(of("auth-callout").length >= 1, `the auth callout: ${JSON.stringify(rows)}`);
      for (const a of of("auth-callout")) assert.equal(a["data-state"], "up", JSON.stringify(a));
      assert.match(
        await text(page, 'table#components tr[data-component="auth-callout"]'),
        /subscribed to \$SYS\.REQ\.USER\.AUTH \(as NATS sees it\); worker auth token/,
      );
      // the certificates: the stack CA the API reads, and each replica's serving certificate (worker
      // TLS, as the callback proxy reaches them), with their expiry
      const certs = await rowsOf(page, "table#certificates tr[data-certificate]");
      const ca = certs.filter((c) => c["data-certificate"] === "stack-ca");
      assert.equal(ca.length, 1, `a stack CA row: ${JSON.stringify(certs)}`);
      assert.equal(ca[0]["data-state"], "ok");
      assert.ok(Number(ca[0]["data-days-left"]) > 14);
      const served = (kind: string) => certs.filter((c) => c["data-served-by"] === kind);
      assert.equal(served("invocation").length, 2, `each invocation replica's: ${JSON.stringify(certs)}`);
      assert.ok(served("grpc-proxy").length >= 2, `each grpc-proxy replica's: ${JSON.stringify(certs)}`);
      for (const c of [...served("invocation"), ...served("grpc-proxy")]) {
        assert.equal(c["data-state"], "ok");
        assert.ok(Number(c["data-days-left"]) >= 1);
      }
      const caText = await text(page, 'table#certificates tr[data-certificate="stack-ca"]');
      assert.match(caText, /\d{4}-\d\d-\d\dT/, "its notAfter is shown");
      await shot("health");
      // Bearer works as well as the cookie, for scripts
      const r = await request(`${consoleUrl}/health`, { headers: { authorization: `Bearer ${admin}` } });
      assert.equal(r.statusCode, 200);
      assert.match(await r.body.text(), /data-component="database"/);
    },
  );

  let echo = { id: "", versionId: "" };
  await t.test("a function deployed through the CLI appears, and its instance goes ready", async () => {
    const created = JSON.parse(
      await cli([
        "function",
        "create",
        "--name",
        "console-echo",
        "--inference-url",
        "/echo",
        "--image",
        "local/echo",
        "--health-uri",
        "/health",
        "--json",
      ]),
    ) as { function: { id: string; versionId: string } };
    echo = { id: created.function.id, versionId: created.function.versionId };
    await cli(["deploy", "create", "console-echo", "--min", "1", "--max", "1"]);
    // the list, filtered on the server by name
    const row = page.locator(`table#functions tr[data-function-name="console-echo"]`);
    await reloadUntil(
      page,
      `${consoleUrl}/functions?q=console-echo`,
      "console-echo 1/1 ready",
      async () => (await row.count()) === 1 && /\b1\/1\b/.test((await row.textContent()) ?? ""),
    );
    assert.equal(await row.getAttribute("data-function-id"), echo.id);
    assert.equal(
      await page.locator("table#functions tr[data-function-id]").count(),
      1,
      "the filter left one row",
    );
    await shot("functions");
    // its page, by its link
    await row.locator(`a[href="/console/functions/${echo.id}"]`).click();
    await page.waitForURL(`${consoleUrl}/functions/${echo.id}`);
    assert.equal(await page.locator(`table#versions tr[data-version-id="${echo.versionId}"]`).count(), 1);
    assert.equal(await page.locator(`table#deployments tr[data-version-id="${echo.versionId}"]`).count(), 1);
    const instances = await rowsOf(page, "table#instances tr[data-instance-id]");
    assert.ok(
      instances.some((i) => i["data-state"] === "ACTIVE"),
      `an ACTIVE instance: ${JSON.stringify(instances)}`,
    );
    await shot("function");
  });

  await t.test("an invocation in flight appears on the live page and leaves it when answered", async () => {
    await page.goto(`${consoleUrl}/live`);
    assert.equal(await page.locator("table#inflight").count(), 1);
    // the page is open before the request starts: what shows up comes by its server-sent events
    const started = Date.now();
    // no progress file before the answer: progress would make the replica answer 202 and let go
    const answer = request(
      `${info.invocation[0]}/v2/nvcf/pexec/functions/${info.demo.slowFunctionId}?seconds=6&progressMs=60000`,
      {
        method: "POST",
        headers: {
          authorization: `Bearer ${info.demo.apiKey}`,
          "content-type": "application/json",
          "nvcf-poll-seconds": "60",
        },
        // past the 32 KiB that travel in the work message: the worker fetches the rest from the
        // replica first, so the replica knows which worker has the request
        body: JSON.stringify({ pad: "x".repeat(48 * 1024) }),
      },
    );
    const slowRow = page
      .locator("table#inflight tr[data-request-id]")
      .filter({ hasText: new RegExp(`${info.demo.slowFunctionId}|demo-slow`) });
    await slowRow
      .first()
      .waitFor({ timeout: 5_000 })
      .catch(async (err: Error) => {
        // what the page showed instead
        const shown = await page.locator("table#inflight tbody").innerHTML();
        const status = await page
          .locator("#live-status")
          .textContent()
          .catch(() => "");
        throw new Error(`${err.message}\nlive status: ${status}\nthe table's rows:\n${shown}`);
      });
    const requestId = await slowRow.first().getAttribute("data-request-id");
    assert.ok(requestId);
    assert.ok(Date.now() - started < 5_500, "it showed while the request was held");
    const rowText = (await slowRow.first().textContent()) ?? "";
    assert.ok(
      holders.some((h) => rowText.includes(h)),
      `the row names the replica that holds it (one of ${holders.join(", ")}): ${rowText}`,
    );
    // the worker that has it: its instance id, and the address it called back from (as the callback
    // proxy saw it: on one machine, the loopback address the worker's connection came from)
    const withWorker = page.locator(
      `table#inflight tr[data-request-id="${requestId}"][data-state="with-worker"]`,
    );
    await withWorker.waitFor({ timeout: 5_000 });
    const instanceId = (await withWorker.getAttribute("data-worker-instance")) ?? "";
    assert.match(instanceId, /^[\w.:@-]+$/, "the worker's instance id");
    const workerCell = (await withWorker.locator("td.worker").textContent()) ?? "";
    assert.ok(workerCell.includes(instanceId), workerCell);
    assert.match(workerCell, /\b127\.\d+\.\d+\.\d+\b/, `the address it called from: ${workerCell}`);
    assert.match((await withWorker.locator("td.state").textContent()) ?? "", /with worker/);
    await shot("live");
    const res = await answer;
    assert.equal(res.statusCode, 200);
    assert.deepEqual(await res.body.json(), { done: true, seconds: 6 });
    assert.equal(res.headers["nvcf-reqid"], requestId, "the row was this request");
    await page
      .locator(`table#inflight tr[data-request-id="${requestId}"]`)
      .waitFor({ state: "detached", timeout: 5_000 });
    assert.equal(new URL(page.url()).pathname, "/console/live", "the row left without a reload");
    // the same instance id the function's page lists among its instances
    await page.goto(`${consoleUrl}/functions/${info.demo.slowFunctionId}`);
    assert.equal(
      await page.locator(`table#instances tr[data-instance-id="${instanceId}"]`).count(),
      1,
      `instance ${instanceId} is one of the slow function's`,
    );
  });

  await t.test("a function's page draws its last hour after some invocations", async () => {
    const n = 5;
    for (let i = 0; i < n; i++) {
      const res = await request(
        `${info.invocation[i % 2]}/v2/nvcf/pexec/functions/${info.demo.httpFunctionId}`,
        {
          method: "POST",
          headers: { authorization: `Bearer ${info.demo.apiKey}`, "content-type": "application/json" },
          body: JSON.stringify({ i }),
        },
      );
      await res.body.text();
      assert.equal(res.statusCode, 200);
    }
    await page.goto(`${consoleUrl}/functions/${info.demo.httpFunctionId}`);
    const summary = page.locator("#graphs-summary");
    assert.ok(
      Number(await summary.getAttribute("data-requests")) >= n,
      `the hour counts the invocations: ${await summary.textContent()}`,
    );
    // uPlot drew each graph: a canvas in each plot, marked by the console's script
    for (const id of ["graph-rate", "graph-errors", "graph-latency"]) {
      await page.locator(`#${id}[data-rendered="true"] canvas`).waitFor({ timeout: 5_000 });
      const box = await page.locator(`#${id} canvas`).boundingBox();
      assert.ok(box && box.width > 200 && box.height > 100, `${id} is drawn: ${JSON.stringify(box)}`);
    }
    // the legend names the series
    assert.match(await text(page, "#graph-latency"), /p99 ms/);
    await shot("function-graphs");
  });

  await t.test("a traced request's page shows its trace, span by span", async () => {
    // a sampled traceparent: recorded whatever the stack's ratio for requests that come without one
    const clientTrace = randomBytes(16).toString("hex");
    const res = await request(`${info.invocation[0]}/v2/nvcf/pexec/functions/${info.demo.httpFunctionId}`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${info.demo.apiKey}`,
        "content-type": "application/json",
        traceparent: `00-${clientTrace}-00f067aa0ba902b7-01`,
      },
      body: JSON.stringify({ traced: true }),
    });
    await res.body.text();
    assert.equal(res.statusCode, 200);
    const requestId = String(res.headers["nvcf-reqid"]);
    // spans are written about a second after they end: the page is loaded again until they are
    const deadline = Date.now() + 15_000;
    for (;;) {
      await page.goto(`${consoleUrl}/requests/${requestId}`);
      if ((await page.locator(`table.trace[data-trace-id="${clientTrace}"]`).count()) > 0) break;
      assert.ok(Date.now() < deadline, `no trace on the request page: ${await text(page, "main")}`);
      await new Promise((r) => setTimeout(r, 500));
    }
    const rows = page.locator("table.trace tbody tr");
    const services: string[] = [];
    for (let n = 0; n < (await rows.count()); n++)
      services.push((await rows.nth(n).getAttribute("data-service")) ?? "");
    assert.ok(services.includes("invocation") && services.includes("worker"), services.join(", "));
    await shot("request-trace");
  });

  let neverReady = { id: "", versionId: "" };
  let failedRequestId = "";
  await t.test("a failed request is found by its id, with its status, code and detail", async () => {
    // a function whose instance never passes its health check: no worker takes its requests
    const created = JSON.parse(
      await cli([
        "function",
        "create",
        "--name",
        "console-never-ready",
        "--inference-url",
        "/echo",
        "--image",
        "local/echo",
        "--health-uri",
        "/never-ready",
        "--json",
      ]),
    ) as { function: { id: string; versionId: string } };
    neverReady = { id: created.function.id, versionId: created.function.versionId };
    await cli(["deploy", "create", "console-never-ready", "--min", "1", "--max", "1"]);
    const res = await request(`${info.invocation[1]}/v2/nvcf/pexec/functions/${neverReady.id}`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${info.demo.apiKey}`,
        "content-type": "application/json",
        "nvcf-poll-seconds": "1",
      },
      body: "{}",
      headersTimeout: 60_000,
    });
    const problem = (await res.body.json()) as { code?: string };
    assert.equal(res.statusCode, 504);
    assert.equal(problem.code, "INVOCATION_TIMEOUT");
    const requestId = String(res.headers["nvcf-reqid"]);
    failedRequestId = requestId;
    // typed into the live page's lookup form
    await page.goto(`${consoleUrl}/live`);
    const input = page.locator("form#lookup input[name=id]");
    await input.focus();
    await page.keyboard.insertText(requestId);
    await page.keyboard.press("Enter");
    await page.waitForURL(`${consoleUrl}/requests/${requestId}`);
    assert.equal(await page.locator("dl#request").count(), 1);
    assert.equal((await text(page, "#request-state")).trim(), "failed");
    const error = await text(page, "#request-error");
    assert.match(error, /504/);
    assert.match(error, /INVOCATION_TIMEOUT/);
    assert.match(error, /no worker answered/);
    await shot("request");
    // an id nobody holds: unknown, not an error page
    const unknown = await page.goto(`${consoleUrl}/requests?id=00000000-0000-8000-8000-000000000000`);
    assert.ok(unknown?.ok(), `an unknown id answered ${unknown?.status()}`);
    assert.match((await text(page, "#request-state")).trim(), /^(unknown|failed)$/);
  });

  await t.test(
    "the scale action, confirmed, changes the instance count and is in the audit log",
    async () => {
      await page.goto(`${consoleUrl}/functions/${echo.id}`);
      const form = page.locator(`table#deployments tr[data-version-id="${echo.versionId}"] form.scale`);
      assert.equal(await form.locator("input[type=hidden][name=functionId]").inputValue(), echo.id);
      assert.equal(await form.locator("input[type=hidden][name=versionId]").inputValue(), echo.versionId);
      await form.locator("input[name=minInstances]").fill("2");
      await form.locator("input[name=maxInstances]").fill("2");
      await form.getByRole("button", { name: /^Scale/ }).click();
      // the confirm page says what will happen, and nothing has happened yet
      await page.locator("button#confirm").waitFor();
      const confirmText = await text(page);
      assert.match(confirmText, /console-echo|[0-9a-f-]{36}/);
      assert.match(confirmText, /\b2\b/);
      const before = JSON.parse(await cli(["deploy", "get", "console-echo", "--json"])) as {
        deployment: { deploymentSpecifications: Array<{ minInstances: number; maxInstances: number }> };
      };
      assert.deepEqual(
        before.deployment.deploymentSpecifications.map((s) => [s.minInstances, s.maxInstances]),
        [[1, 1]],
        "nothing changed before the confirmation",
      );
      await shot("confirm");
      await page.locator("button#confirm").click();
      await page.waitForURL(`${consoleUrl}/functions/${echo.id}`);
      const after = JSON.parse(await cli(["deploy", "get", "console-echo", "--json"])) as typeof before;
      assert.deepEqual(
        after.deployment.deploymentSpecifications.map((s) => [s.minInstances, s.maxInstances]),
        [[2, 2]],
      );
      assert.match(
        await text(page, `table#deployments tr[data-version-id="${echo.versionId}"]`),
        /\b2\s*[–-]\s*2\b/,
      );
      // the compute agent starts the second instance; the page shows it ready
      await reloadUntil(
        page,
        `${consoleUrl}/functions/${echo.id}`,
        "two ACTIVE instances",
        async () => {
          const is = await rowsOf(page, "table#instances tr[data-instance-id]");
          return is.filter((i) => i["data-state"] === "ACTIVE").length === 2;
        },
        60_000,
      );
      await page.goto(`${consoleUrl}/functions?q=console-echo`);
      assert.match(await text(page, `table#functions tr[data-function-id="${echo.id}"]`), /\b2\/2\b/);
      // the audit log: who, what, which deployment
      await page.goto(`${consoleUrl}/audit`);
      const rows = page.locator("table#audit tr[data-action=scale]");
      assert.equal(await rows.count(), 1);
      const row = (await rows.textContent()) ?? "";
      assert.match(row, new RegExp(`${echo.id}|console-echo`));
      assert.match(row, /\b2\b/);
    },
  );

  await t.test("the undeploy action, confirmed, removes the deployment and is in the audit log", async () => {
    await page.goto(`${consoleUrl}/functions/${neverReady.id}`);
    const form = page.locator(
      `table#deployments tr[data-version-id="${neverReady.versionId}"] form.undeploy`,
    );
    await form.getByRole("button", { name: /^Undeploy/ }).click();
    await page.locator("button#confirm").waitFor();
    assert.match(await text(page), /console-never-ready|[0-9a-f-]{36}/);
    await page.locator("button#confirm").click();
    await page.waitForURL(`${consoleUrl}/functions/${neverReady.id}`);
    assert.equal(await page.locator("table#deployments tr[data-version-id]").count(), 0);
    const left = await runCli(["deploy", "get", "console-never-ready"], { cwd: dir, env: cliEnv(admin) });
    assert.notEqual(left.code, 0, "the deployment is gone");
    await page.goto(`${consoleUrl}/audit`);
    assert.equal(await page.locator("table#audit tr[data-action=undeploy]").count(), 1);
    // newest first
    assert.deepEqual(
      (await rowsOf(page, "table#audit tr[data-action]")).map((r) => r["data-action"]),
      ["undeploy", "scale"],
    );
    await shot("audit");
  });

  await t.test(
    "the deploy action deploys a version that has none, confirmed, and is in the audit log",
    async () => {
      await page.goto(`${consoleUrl}/functions/${neverReady.id}`);
      const form = page.locator("form#deploy");
      assert.equal(await form.locator("select[name=versionId]").inputValue(), neverReady.versionId);
      const types = await form.locator("select[name=instanceType] option").allTextContents();
      assert.ok(
        types.some((o) => o.includes("local/local.cpu")),
        `the cluster's instance types: ${types.join(", ")}`,
      );
      // bad input: a clear error page with its code, and nothing deployed
      await form.locator("input[name=minInstances]").fill("3");
      await form.locator("input[name=maxInstances]").fill("1");
      await form.getByRole("button", { name: /^Deploy/ }).click();
      await page.locator("#error").waitFor();
      assert.equal(await page.locator("#error").getAttribute("data-code"), "VALIDATION_FAILED");
      assert.match(await text(page, "#error"), /minInstances \(3\) is larger than maxInstances \(1\)/);
      await shot("deploy-refused");
      await page.goto(`${consoleUrl}/functions/${neverReady.id}`);
      await form.locator("input[name=minInstances]").fill("0");
      await form.locator("input[name=maxInstances]").fill("1");
      await form.getByRole("button", { name: /^Deploy/ }).click();
      await page.locator("button#confirm").waitFor();
      assert.match(await text(page, "#confirm-what"), /Deploy version[\s\S]*local\/local\.cpu[\s\S]*0–1/);
      const none = await runCli(["deploy", "get", "console-never-ready"], { cwd: dir, env: cliEnv(admin) });
      assert.notEqual(none.code, 0, "nothing deployed before the confirmation");
      await shot("deploy-confirm");
      await page.locator("button#confirm").click();
      await page.waitForURL(`${consoleUrl}/functions/${neverReady.id}`);
      assert.equal(
        await page.locator(`table#deployments tr[data-version-id="${neverReady.versionId}"]`).count(),
        1,
      );
      assert.equal(await page.locator("form#deploy").count(), 0, "no version left to deploy");
      const d = JSON.parse(await cli(["deploy", "get", "console-never-ready", "--json"])) as {
        deployment: { deploymentSpecifications: Array<{ instanceType: string; maxInstances: number }> };
      };
      assert.deepEqual(
        d.deployment.deploymentSpecifications.map((s) => [s.instanceType, s.maxInstances]),
        [["local.cpu", 1]],
      );
      await page.goto(`${consoleUrl}/audit`);
      assert.deepEqual(
        (await rowsOf(page, "table#audit tr[data-action]")).map((r) => r["data-action"]),
        ["deploy", "undeploy", "scale"],
      );
      assert.match(await text(page, "table#audit tr[data-action=deploy]"), /console-never-ready/);
      await shot("audit-deploy");
    },
  );

  await t.test("a form posted from another origin is refused and changes nothing", async () => {
    const body = new URLSearchParams({
      functionId: echo.id,
      versionId: echo.versionId,
      minInstances: "1",
      maxInstances: "1",
      confirmed: "1",
    }).toString();
    const r = await request(`${consoleUrl}/actions/scale`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${admin}`,
        origin: "http://elsewhere.example",
        "content-type": "application/x-www-form-urlencoded",
      },
      body,
    });
    assert.equal(r.statusCode, 403);
    assert.match(await r.body.text(), /CONSOLE_CROSS_ORIGIN/);
    const d = JSON.parse(await cli(["deploy", "get", "console-echo", "--json"])) as {
      deployment: { deploymentSpecifications: Array<{ minInstances: number }> };
    };
    assert.equal(d.deployment.deploymentSpecifications[0].minInstances, 2);
  });

  await t.test(
    "the logs page finds the failed request's lines by its id, live, and refuses a bad id",
    async () => {
      assert.ok(failedRequestId, "the failed request's test ran");
      await page.goto(`${consoleUrl}/logs`);
      assert.equal(await page.locator('nav a[href="/console/logs"][aria-current="page"]').count(), 1);
      // typed into the filter form, submitted from the keyboard
      await page.locator("#log-request-id").focus();
      await page.keyboard.insertText(failedRequestId.toUpperCase());
      await page.keyboard.press("Enter");
      await page.waitForURL(/\/console\/logs\?requestId=/);
      assert.equal(await page.inputValue("#log-request-id"), failedRequestId);
      const rows = page.locator("#logs tbody tr[data-level]");
      assert.ok((await rows.count()) >= 1, await text(page, "#logs"));
      const cells: string[][] = [];
      for (let i = 0; i < (await rows.count()); i++)
        cells.push((await rows.nth(i).locator("td").allTextContents()).map((c) => c.trim()));
      for (const c of cells)
        assert.equal(c[5], failedRequestId, `a row of another request: ${c.join(" | ")}`);
      const line = cells.find((c) => c[4] === "no worker answered within the window");
      assert.ok(line, cells.map((c) => c.join(" | ")).join("\n"));
      assert.equal(line[1], "invocation");
      assert.ok(holders.includes(line[2]), `replica ${line[2]} is one of ${holders.join(", ")}`);
      assert.match(line[6], new RegExp(`functionId=${neverReady.id}`));
      // the live stream replaces the rows; Pause holds them still
      await page.locator("#logs-status", { hasText: /^updated/ }).waitFor();
      assert.ok((await rows.count()) >= 1, "the live update kept the request's rows");
      await page.locator("#logs-pause").focus();
      await page.keyboard.press("Enter");
      assert.equal((await text(page, "#logs-status")).trim(), "paused");
      assert.equal(await page.getAttribute("#logs-pause", "aria-pressed"), "true");
      await shot("logs");
      const bad = await page.goto(`${consoleUrl}/logs?requestId=nope`);
      assert.equal(bad?.status(), 400);
      assert.equal(
        await page.getAttribute("#error", "data-code"),
        "VALIDATION_FAILED",
        await shownError(page),
      );
      assert.match(await text(page, "#error"), /requestId: "nope" is not a UUID/);
    },
  );

  await t.test(
    "the logs page shows the callback proxy's access line of a request whose answer went through it",
    async () => {
      // an answer larger than a NATS answer (64 KiB) is posted to request-attach through the proxy
      const body = JSON.stringify({ pad: "x".repeat(100_000) });
      const res = await request(`${info.invocation[0]}/v2/nvcf/pexec/functions/${info.demo.httpFunctionId}`, {
        method: "POST",
        headers: { authorization: `Bearer ${info.demo.apiKey}`, "content-type": "application/json" },
        body,
      });
      assert.equal(res.statusCode, 200);
      assert.equal((await res.body.text()).length, body.length);
      const requestId = String(res.headers["nvcf-reqid"]);
      const proxyRows = page.locator('#logs tbody tr[data-service="callback-proxy"]');
      await waitFor(
        "the callback proxy's line on the logs page",
        async () => {
          await page.goto(`${consoleUrl}/logs?requestId=${requestId}`);
          return (await proxyRows.count()) >= 1 || undefined;
        },
        { timeoutMs: 10_000, intervalMs: 300 },
      );
      const cells: string[][] = [];
      for (let i = 0; i < (await proxyRows.count()); i++)
        cells.push((await proxyRows.nth(i).locator("td").allTextContents()).map((c) => c.trim()));
      // the worker's POST of the answer (and its GET of the body, when it fetched one)
      const posted = cells.find((c) => /method=POST/.test(c[6]));
      assert.ok(posted, cells.map((c) => c.join(" | ")).join("\n"));
      assert.equal(posted[1], "callback-proxy");
      assert.equal(posted[4], "callback");
      assert.equal(posted[5], requestId, "the row links the request");
      assert.match(posted[6], /path=\/v2\/nvcf\/worker\/request-attach/);
      assert.match(posted[6], /target=[0-9-]+\.invocation\./);
      assert.match(posted[6], /status=200/);
      assert.match(posted[6], /outcome=forwarded/);
      assert.match(posted[6], /durationMs=\d+/);
      // the answer's 100 KB, head included
      assert.match(posted[6], /bytesIn=1\d{5}\b/);
      assert.equal(
        await page
          .locator(`#logs tbody tr[data-service="callback-proxy"] a[href="/console/requests/${requestId}"]`)
          .count(),
        cells.length,
      );
      await shot("logs-callback-proxy");
    },
  );

  await t.test("at a phone's width (390x844) a page fits the screen", async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    try {
      await page.goto(`${consoleUrl}/functions`);
      await shot("functions-phone");
      const width = await page.evaluate<number>("document.documentElement.scrollWidth");
      assert.ok(width <= 390, `the page is ${width} px wide: wider than the screen`);
    } finally {
      await page.setViewportSize({ width: 1280, height: 800 });
    }
  });

  await t.test("no page loaded anything from outside, and no page script failed", () => {
    assert.deepEqual(b.outside, []);
    assert.deepEqual(b.errors, []);
  });

  await t.test("with the admin issuer disabled, the health page has no issuer row", async () => {
    run.child.kill("SIGINT");
    const { code } = await run.exited;
    assert.equal(code, 0, run.output());
    writeFileSync(
      cfg.file,
      readFileSync(cfg.file, "utf8").replace(
        /^adminIssuerProxy:\n/m,
        "adminIssuerProxy:\n  enabled: false\n",
      ),
    );
    run = runStack(ctx, dir, cfg.file);
    info = await waitStackReady(run, cfg.dataDir);
    // the issuer's tokens are refused for good: the old session shows nothing
    await page.goto(`${consoleUrl}/health`);
    assert.equal(
      await page.locator("form#login").count(),
      1,
      "the issuer's token no longer opens the console",
    );
    assert.equal(await page.locator("table#components").count(), 0);
    // an admin token from the stack's signing key, as the stack tells the operator to get one
    const token = (
      await runCli(["admin", "token"], {
        cwd: dir,
        env: { ...CLI_CLEAN_ENV, HOME: dir, CALLPLANE__GLOBAL__DATA_DIR: cfg.dataDir },
      })
    ).stdout.trim();
    assert.ok(token, "callplane admin token printed a token");
    await logIn(page, consoleUrl, token);
    const rows = await reloadUntil(page, `${consoleUrl}/health`, "both invocation replicas up", async () => {
      const r = await rowsOf(page, "table#components tr[data-component]");
      return r.filter((x) => x["data-component"] === "invocation" && x["data-state"] === "up").length === 2
        ? r
        : undefined;
    });
    const components = rows.map((r) => r["data-component"]);
    for (const c of ["api", "database", "nats", "invocation", "grpc-proxy"])
      assert.ok(components.includes(c), `a ${c} row`);
    assert.ok(!components.includes("admin-issuer"), "no admin-issuer row at all");
    await shot("health-issuer-disabled");
  });

  t.diagnostic(`screenshots: ${shots.join(", ")}`);
});
