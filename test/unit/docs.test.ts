// Keeps docs/errors.md and docs/configuration.md in step with the code they describe: a code or a
// configuration key that exists on one side only, or a status, kind, title or default that differs,
// fails here instead of misleading an operator later.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { configSchema, loadConfig } from "../../src/lib/config/index.js";
import { ERROR_CODES, GRPC_STATUS, problemType, type ErrorCode } from "../../src/lib/errors.js";
import { GRPC } from "../../src/lib/grpc/index.js";

// compiled to dist/test/unit/, so the repository root is three levels up
const repoRoot = join(import.meta.dirname, "..", "..", "..");
const readDoc = (name: string) => readFileSync(join(repoRoot, "docs", name), "utf8");

/** Splits one markdown table row into trimmed cells. */
function cells(line: string): string[] {
  const t = line.trim();
  assert.ok(t.startsWith("|") && t.endsWith("|"), `not a table row: ${line}`);
  return t
    .slice(1, -1)
    .split("|")
    .map((c) => c.trim());
}

/** The rows of the table whose header row is exactly `header`, as arrays of cells. */
function tableRows(doc: string, header: string[]): string[][] {
  const lines = doc.split("\n");
  const at = lines.findIndex((l) => l.trim().startsWith("|") && cells(l).join("|") === header.join("|"));
  assert.notEqual(at, -1, `no table with columns ${header.join(" | ")}`);
  assert.match(
    lines[at + 1] ?? "",
    /^\|(\s*:?-+:?\s*\|)+$/,
    "the header row must be followed by a separator row",
  );
  const rows: string[][] = [];
  for (let i = at + 2; i < lines.length && lines[i].trim().startsWith("|"); i++) {
    const row = cells(lines[i]);
    assert.equal(row.length, header.length, `row ${i + 1} has ${row.length} cells, not ${header.length}`);
    rows.push(row);
  }
  assert.ok(rows.length > 0, "the table is empty");
  return rows;
}

/** The text of a cell that holds exactly one inline code span. */
function onlyCode(cell: string, what: string): string {
  const m = /^`([^`]+)`$/.exec(cell);
  assert.ok(m, `${what}: expected one backquoted value, got ${cell}`);
  return m[1];
}

const fencedBlocks = (doc: string, lang: string): string[] =>
  [...doc.matchAll(new RegExp("^```" + lang + "\\n([\\s\\S]*?)^```", "gm"))].map((m) => m[1]);
const withoutFences = (doc: string): string => doc.replace(/^```[\s\S]*?^```/gm, "");

// ---------------------------------------------------------------- errors

const ERRORS_HEADER = ["code", "status", "gRPC", "kind", "title", "when it happens and what to do"];
const GRPC_NAMES = Object.fromEntries(Object.entries(GRPC).map(([name, n]) => [n, name]));

void test("docs/errors.md lists every error code, in order, with its status, gRPC status, kind and title", () => {
  const rows = tableRows(readDoc("errors.md"), ERRORS_HEADER);
  const codes = rows.map((r) => onlyCode(r[0], "code column"));
  assert.deepEqual(
    codes,
    Object.keys(ERROR_CODES),
    "codes in the doc differ from ERROR_CODES (names or order)",
  );
  for (const [code, status, grpc, kind, title, what] of rows) {
    const name = onlyCode(code, "code column") as ErrorCode;
    const want = ERROR_CODES[name];
    assert.equal(Number(status), want.status, `${code}: status`);
    assert.equal(onlyCode(grpc, "gRPC column"), GRPC_NAMES[GRPC_STATUS[name]], `${code}: gRPC status`);
    assert.equal(kind, want.kind, `${code}: kind`);
    assert.equal(title, want.title, `${code}: title`);
    assert.ok(what.length >= 40, `${code}: say when it happens and what to do`);
  }
});

void test("docs/errors.md states the problem type rule that problemType() implements", () => {
  const doc = readDoc("errors.md");
  const rule = /`urn:callplane:problem:<code in lower kebab case>`/.exec(doc);
  assert.ok(rule, "the doc must state the type as `urn:callplane:problem:<code in lower kebab case>`");
  for (const code of Object.keys(ERROR_CODES) as ErrorCode[]) {
    const kebab = code.toLowerCase().replaceAll("_", "-");
    assert.equal(problemType(code), `urn:callplane:problem:${kebab}`, code);
  }
  // every concrete type the doc shows is the type of a real code
  const known = new Set((Object.keys(ERROR_CODES) as ErrorCode[]).map((c) => problemType(c)));
  const shown = [...doc.matchAll(/urn:callplane:problem:[a-z][a-z-]*/g)].map((m) => m[0]);
  assert.ok(shown.length > 0, "the doc shows no example type");
  for (const t of shown) assert.ok(known.has(t), `${t} is not the type of any code`);
  // the example problem document is what CallplaneError.toProblem() would send
  const examples = fencedBlocks(doc, "json");
  assert.ok(examples.length > 0, "the doc has no example problem document");
  for (const text of examples) {
    const p = JSON.parse(text) as Record<string, unknown>;
    const code = p.code as ErrorCode;
    assert.ok(code in ERROR_CODES, `example code ${String(p.code)}`);
    assert.deepEqual(
      { type: p.type, title: p.title, status: p.status },
      { type: problemType(code), title: ERROR_CODES[code].title, status: ERROR_CODES[code].status },
    );
    assert.equal(typeof p.detail, "string");
  }
});

void test("error kinds match the doc's rule: user codes are 4xx, system codes 5xx", () => {
  for (const [code, e] of Object.entries(ERROR_CODES)) {
    assert.equal(
      e.kind === "user",
      e.status >= 400 && e.status < 500,
      `${code} is ${e.kind} with ${e.status}`,
    );
  }
});

// ---------------------------------------------------------------- configuration

interface Leaf {
  path: string;
  schema: z.ZodType;
}

/** Strips defaults, prefaults, optionals and pipes to reach the type that validates the value. */
function unwrap(t: z.ZodType): z.ZodType {
  let cur = t;
  for (;;) {
    if (cur instanceof z.ZodDefault || cur instanceof z.ZodPrefault || cur instanceof z.ZodOptional) {
      cur = cur.unwrap() as z.ZodType;
    } else if (cur instanceof z.ZodPipe) {
      cur = cur.in as z.ZodType;
    } else {
      return cur;
    }
  }
}

function walk(t: z.ZodType, prefix: string[], leaves: Leaf[], sections: Set<string>): void {
  const inner = unwrap(t);
  if (inner instanceof z.ZodObject) {
    if (prefix.length) sections.add(prefix.join("."));
    const shape: Record<string, z.ZodType> = inner.shape;
    for (const [k, v] of Object.entries(shape)) walk(v, [...prefix, k], leaves, sections);
  } else {
    leaves.push({ path: prefix.join("."), schema: inner });
  }
}

const leaves: Leaf[] = [];
const sectionPaths = new Set<string>();
walk(configSchema, [], leaves, sectionPaths);
const leafPaths = new Set(leaves.map((l) => l.path));
const topSections = new Set(Object.keys(configSchema.shape));

function valueAt(obj: unknown, path: string): unknown {
  return path.split(".").reduce<unknown>((o, k) => (o as Record<string, unknown>)[k], obj);
}

const CONFIG_HEADER = ["key", "type", "default", "meaning"];
const configDoc = readDoc("configuration.md");
const configRows = tableRows(configDoc, CONFIG_HEADER).map(([key, type, def, meaning]) => ({
  key: onlyCode(key, "key column"),
  type,
  def,
  meaning,
}));

void test("the schema walk finds the configuration's leaves", () => {
  // guards the walk itself: if it stopped unwrapping, it would find only the top-level sections
  assert.ok(leafPaths.has("invocation.authCache.ttlSeconds"));
  assert.ok(leafPaths.has("global.workerEndpoints.invocationServiceURL"));
  assert.ok(!leafPaths.has("invocation"));
  assert.ok(leaves.length > 30, `only ${leaves.length} leaves`);
});

void test("docs/configuration.md lists every configuration key, and only real ones", () => {
  const documented = configRows.map((r) => r.key);
  const dupes = documented.filter((k, i) => documented.indexOf(k) !== i);
  assert.deepEqual(dupes, [], "keys listed twice");
  const missing = [...leafPaths].filter((p) => !documented.includes(p));
  assert.deepEqual(missing, [], "keys in the schema but not in the reference table");
  const unknown = documented.filter((p) => !leafPaths.has(p));
  assert.deepEqual(unknown, [], "keys in the reference table but not in the schema");
});

void test("every key path the configuration and error docs mention exists", () => {
  // A backquoted dotted name that starts with a section (`invocation.relay.enabled`) must be a key or
  // a section; other dotted names (`nvcf.svc.cluster.local`, `stack.json`) are not key paths.
  for (const name of ["configuration.md", "errors.md"]) {
    const prose = withoutFences(readDoc(name));
    const mentioned = [...prose.matchAll(/`([a-z][A-Za-z0-9]*(?:\.[a-z][A-Za-z0-9]*)+)`/g)]
      .map((m) => m[1])
      .filter((p) => topSections.has(p.split(".")[0]));
    assert.ok(mentioned.length > 0, `${name} mentions no key`);
    const bad = mentioned.filter((p) => !leafPaths.has(p) && !sectionPaths.has(p));
    assert.deepEqual([...new Set(bad)], [], `${name} mentions key paths the schema does not have`);
  }
});

void test("the reference table's types agree with the schema", () => {
  const byPath = new Map(leaves.map((l) => [l.path, l.schema]));
  for (const row of configRows) {
    const s = byPath.get(row.key);
    if (!s) continue; // reported by the test above
    if (s instanceof z.ZodBoolean) assert.match(row.type, /\bboolean\b/, row.key);
    if (s instanceof z.ZodEnum) {
      assert.match(row.type, /^one of /, row.key);
      for (const o of s.options) assert.ok(row.type.includes(`\`${String(o)}\``), `${row.key}: option ${o}`);
    }
    if (s instanceof z.ZodNumber) {
      assert.match(row.type, s.isInt ? /\binteger\b/ : /\b(seconds|number)\b/, row.key);
      const max = s.maxValue;
      if (max !== null && Number.isFinite(max) && max < Number.MAX_SAFE_INTEGER)
        assert.ok(row.type.includes(String(max)), `${row.key}: the type should give the maximum ${max}`);
    }
  }
});

void test("loadConfig() succeeds with defaults, and the documented defaults are the real ones", () => {
  const dir = mkdtempSync(join(tmpdir(), "callplane-docs-"));
  try {
    const loaded = loadConfig({ env: {}, cwd: dir });
    const raw = configSchema.parse({}); // before derived values are filled in
    for (const row of configRows) {
      if (!leafPaths.has(row.key)) continue;
      const derived = /^derived: `([^`]+)`$/.exec(row.def);
      if (derived) {
        // the schema leaves it empty and loadConfig computes it from other keys
        assert.equal(valueAt(raw, row.key), "", `${row.key}: a derived default starts empty`);
        const want = derived[1].replaceAll(/<([A-Za-z0-9.]+)>/g, (_, p: string) => {
          assert.ok(leafPaths.has(p), `${row.key}: <${p}> is not a key`);
          return String(valueAt(loaded, p));
        });
        assert.equal(valueAt(loaded, row.key), want, `${row.key}: derived default`);
        continue;
      }
      const literal = parseYaml(onlyCode(row.def, `${row.key}: default column`)) as unknown;
      assert.deepEqual(literal, valueAt(raw, row.key), `${row.key}: default`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

void test("the configuration doc's examples load", () => {
  const dir = mkdtempSync(join(tmpdir(), "callplane-docs-"));
  try {
    const yamls = fencedBlocks(configDoc, "yaml");
    assert.ok(yamls.length > 0, "no example file");
    for (const [i, text] of yamls.entries()) {
      const file = join(dir, `example-${i}.yaml`);
      writeFileSync(file, text);
      assert.doesNotThrow(() => loadConfig({ file, env: {}, cwd: dir }), `example file ${i + 1}`);
    }
    const overrides = fencedBlocks(configDoc, "sh").flatMap((b) => [
      ...b.matchAll(/\b(CALLPLANE__[A-Z0-9_]+)=(\S+)/g),
    ]);
    assert.ok(overrides.length > 0, "no environment override example");
    for (const [, name, value] of overrides) {
      const c = loadConfig({ env: { [name]: value }, cwd: dir });
      const path = name
        .slice("CALLPLANE__".length)
        .split("__")
        .map((seg) => seg.toLowerCase().replace(/_([a-z0-9])/g, (_, ch: string) => ch.toUpperCase()))
        .join(".");
      assert.deepEqual(valueAt(c, path), parseYaml(value), `${name}=${value}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
