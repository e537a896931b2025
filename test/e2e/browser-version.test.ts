// The browser tests drive Debian's chromium with playwright-core: the two must agree on Chromium's
// major (playwright-core speaks the DevTools protocol of the Chromium it was released with). When
// Debian moves chromium on, this fails first and says which playwright-core to pin.
import assert from "node:assert/strict";
import { test } from "node:test";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { CHROMIUM, CHROMIUM_ARGS, browserMismatch, browserVersions } from "../testkit/browser.js";
import { removeDir } from "../testkit/scope.js";

test("Debian's chromium has the major playwright-core was released for", () => {
  const v = browserVersions();
  assert.equal(browserMismatch(v), undefined);
  assert.match(v.chromium ?? "", /^\d+\.\d+\.\d+\.\d+$/);
});

test("the mismatch message names both versions and the fix", () => {
  const wrong = browserMismatch({
    chromium: "150.0.7871.100",
    playwright: "1.64.1",
    playwrightChromium: "156.0.8078.4",
  });
  assert.match(wrong ?? "", /chromium is 150\.0\.7871\.100 \(major 150\)/);
  assert.match(
    wrong ?? "",
    /playwright-core 1\.64\.1 was released with Chromium 156\.0\.8078\.4 \(major 156\)/,
  );
  assert.match(wrong ?? "", /pin playwright-core in package\.json/);
  const missing = browserMismatch({
    chromium: undefined,
    playwright: "1.64.1",
    playwrightChromium: "156.0.8078.4",
  });
  assert.match(missing ?? "", /\/usr\/bin\/chromium is missing.*scripts\/ensure-chromium\.sh/);
});

test("the running browser reports the version its launcher printed", async (t) => {
  // what playwright-core talks to, not only what --version prints (a launcher could start another binary)
  const profile = mkdtempSync(join(tmpdir(), "callplane-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [...CHROMIUM_ARGS],
  });
  t.after(async () => {
    await context.close();
    removeDir(profile);
  });
  // the browser's own answer over the DevTools protocol (a user agent carries only the major)
  const page = context.pages()[0] ?? (await context.newPage());
  const cdp = await context.newCDPSession(page);
  const { product } = (await cdp.send("Browser.getVersion")) as { product: string };
  assert.equal(product.replace(/^(Headless)?Chrome\//, ""), browserVersions().chromium, product);
});
