// A real browser for tests: Debian's chromium (/usr/bin/chromium, installed by
// scripts/ensure-chromium.sh) driven by playwright-core, which package.json pins to the release
// whose bundled Chromium has the same major. Playwright speaks the DevTools protocol of its own
// Chromium; a browser of another major may accept it and then fail in ways that say nothing about
// the version, so a test checks the two majors first and names both when they differ.
//
// The machine's network is closed: the browser starts with its background traffic off (component
// updates, sync, field trials, QUIC probes), a profile of its own removed afterwards, and every
// request a page makes to a host other than the one under test is recorded (`outside`), so a test
// can assert that a page loads nothing from outside.
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { TestContext } from "node:test";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { repoRoot } from "./paths.js";
import { removeDir } from "./scope.js";

type Ctx = Pick<TestContext, "after">;

/** Where Debian's chromium package puts its launcher. */
export const CHROMIUM = "/usr/bin/chromium";

/** Where a suite's artefacts (screenshots) go: under the checkout, ignored by git (.callplane/). */
export function testOutputDir(suite: string): string {
  return join(repoRoot, ".callplane", "test-output", suite);
}

export interface BrowserVersions {
  /** `chromium --version`'s version, e.g. 156.0.8078.114 (undefined when it is not installed). */
  chromium: string | undefined;
  /** playwright-core's own version, e.g. 1.64.1. */
  playwright: string;
  /** The Chromium that playwright-core was released with (its browsers.json), e.g. 156.0.8078.4. */
  playwrightChromium: string;
}

const major = (v: string | undefined) => (v === undefined ? undefined : Number(v.split(".")[0]));

export function browserVersions(bin = CHROMIUM): BrowserVersions {
  const pkgFile = createRequire(import.meta.url).resolve("playwright-core/package.json");
  const pkg = JSON.parse(readFileSync(pkgFile, "utf8")) as { version: string };
  // not in the package's exports map: read beside package.json
  const browsers = JSON.parse(readFileSync(join(dirname(pkgFile), "browsers.json"), "utf8")) as {
    browsers: Array<{ name: string; browserVersion: string }>;
  };
  const bundled = browsers.browsers.find((b) => b.name === "chromium");
  if (!bundled) throw new Error(`playwright-core ${pkg.version}'s browsers.json names no chromium`);
  let chromiumVersion: string | undefined;
  try {
    // Debian's launcher is a shell script whose profile snippets may write to stderr: only stdout counts
    const out = execFileSync(bin, ["--version"], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "ignore"],
      timeout: 30_000,
    });
    chromiumVersion = /Chromium (\d+\.\d+\.\d+\.\d+)/.exec(out)?.[1];
  } catch {
    // not installed: reported as such by browserMismatch
  }
  return { chromium: chromiumVersion, playwright: pkg.version, playwrightChromium: bundled.browserVersion };
}

/** What is wrong with the browser set-up, in words that say how to fix it; undefined when nothing is. */
export function browserMismatch(v: BrowserVersions = browserVersions(), bin = CHROMIUM): string | undefined {
  if (v.chromium === undefined)
    return (
      `${bin} is missing (or \`${bin} --version\` fails): the browser tests need Debian's chromium ` +
      `${major(v.playwrightChromium)}; run scripts/ensure-chromium.sh as root (npm test does)`
    );
  if (major(v.chromium) !== major(v.playwrightChromium))
    return (
      `Debian's chromium is ${v.chromium} (major ${major(v.chromium)}) but playwright-core ${v.playwright} ` +
      `was released with Chromium ${v.playwrightChromium} (major ${major(v.playwrightChromium)}): ` +
      `pin playwright-core in package.json (an exact version) to the release whose browsers.json names ` +
      `Chromium ${major(v.chromium)} (\`npm pack playwright-core@<v>\` and read package/browsers.json), ` +
      `or bring chromium to ${major(v.playwrightChromium)} (\`apt-get update && apt-get install chromium\`)`
    );
  return undefined;
}

/** Flags that keep a headless chromium quiet on a closed network and workable as root in a container. */
export const CHROMIUM_ARGS = [
  // the tests run as root in containers without user namespaces
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-default-apps",
  "--disable-domain-reliability",
  "--disable-breakpad",
  "--metrics-recording-only",
  "--no-pings",
  // /dev/shm may be small in a container; Debian's launcher adds this too when it is
  "--disable-dev-shm-usage",
] as const;

export interface TestBrowser {
  context: BrowserContext;
  /** The context's first page, at `viewport`. */
  page: Page;
  /** Where screenshots go (created). */
  outDir: string;
  /** Writes `<outDir>/<name>.png` of the page (the whole page, not only the viewport) and returns its path. */
  screenshot(name: string, page?: Page): Promise<string>;
  /** Requests pages made to hosts other than `allowHosts` (they are refused, not sent). */
  outside: string[];
  /**
   * Uncaught errors of a page's scripts (`pageerror`), console messages of level error, and what a
   * page loaded besides itself that answered 400 or more.
   */
  errors: string[];
}

/**
 * Starts chromium with a fresh profile, closed (and the profile removed) when the test ends.
 * Fails at once, with the fix, when chromium's major differs from playwright-core's.
 */
export async function startBrowser(
  t: Ctx,
  opts: {
    /** Hosts (host:port) pages may load from; anything else is refused and recorded in `outside`. */
    allowHosts: string[];
    outDir: string;
    viewport?: { width: number; height: number };
  },
): Promise<TestBrowser> {
  const wrong = browserMismatch();
  if (wrong) throw new Error(wrong);
  const profile = mkdtempSync(join(tmpdir(), "callplane-chromium-"));
  mkdirSync(opts.outDir, { recursive: true });
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [...CHROMIUM_ARGS],
    viewport: opts.viewport ?? { width: 1280, height: 800 },
    // a page's own timers decide; a test that waits says how long
    timeout: 30_000,
  });
  // one hook: the browser closes before its profile is removed
  t.after(async () => {
    await context.close().catch(() => undefined);
    removeDir(profile);
  });
  context.setDefaultTimeout(15_000);
  const outside: string[] = [];
  const errors: string[] = [];
  const allowed = new Set(opts.allowHosts);
  await context.route("**/*", async (route) => {
    const url = new URL(route.request().url());
    if (url.protocol === "data:" || url.protocol === "blob:" || allowed.has(url.host))
      return route.continue();
    outside.push(url.href);
    return route.abort("blockedbyclient");
  });
  const watch = (p: Page) => {
    p.on("pageerror", (err) => errors.push(`${p.url()}: ${err.message}`));
    // a page answered 401 or 403 is the server's answer, not a failure of the page: only what a
    // page loads besides itself (stylesheets, scripts, event streams) counts
    p.on("response", (r) => {
      if (r.status() >= 400 && r.request().resourceType() !== "document")
        errors.push(`${p.url()}: ${r.request().resourceType()} ${r.url()} answered ${r.status()}`);
    });
    p.on("console", (m) => {
      if (m.type() === "error" && !m.text().startsWith("Failed to load resource"))
        errors.push(`${p.url()}: console: ${m.text()}`);
    });
  };
  context.on("page", watch);
  const page = context.pages()[0] ?? (await context.newPage());
  watch(page);
  return {
    context,
    page,
    outDir: opts.outDir,
    outside,
    errors,
    async screenshot(name, p = page) {
      const file = join(opts.outDir, `${name}.png`);
      await p.screenshot({ path: file, fullPage: true });
      return file;
    },
  };
}
