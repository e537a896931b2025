// Reads the environment file once: the YAML, CALLPLANE__<SECTION>__<KEY> overrides from the
// environment, the schema (every bad field named by its path), the rules that relate fields, the
// values derived from others, and the rules on resolved paths; the result is frozen.
import { readFileSync } from "node:fs";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { keyFileProblems } from "./admin-issuer.js";
import { resolveDerived } from "./derived.js";
import { crossFieldProblems } from "./rules.js";
import { configSchema, type Config, type ConfigInput } from "./schema.js";

export class ConfigError extends Error {
  readonly problems: string[];
  constructor(source: string, problems: string[]) {
    super(`invalid configuration (${source}):\n${problems.map((p) => `  - ${p}`).join("\n")}`);
    this.name = "ConfigError";
    this.problems = problems;
  }
}

function formatIssues(issues: z.core.$ZodIssue[]): string[] {
  const out: string[] = [];
  for (const issue of issues) {
    const path = issue.path.map(String).join(".");
    if (issue.code === "unrecognized_keys") {
      for (const key of issue.keys) out.push(`${path ? `${path}.` : ""}${key}: unknown key`);
    } else {
      out.push(`${path || "(root)"}: ${issue.message}`);
    }
  }
  return out;
}

function camelKey(segment: string, keys: string[]): string | undefined {
  const want = segment.replaceAll("_", "").toLowerCase();
  return keys.find((k) => k.toLowerCase() === want);
}

/** Applies CALLPLANE__A__B=value overrides onto the raw document, checking each path against the schema. */
function applyEnvOverrides(doc: Record<string, unknown>, env: NodeJS.ProcessEnv, problems: string[]): void {
  for (const [name, raw] of Object.entries(env)) {
    if (!name.startsWith("CALLPLANE__") || raw === undefined) continue;
    const segments = name.slice("CALLPLANE__".length).split("__");
    let shape: z.ZodType = configSchema;
    let target: Record<string, unknown> = doc;
    const path: string[] = [];
    let ok = true;
    for (const [i, seg] of segments.entries()) {
      const inner = unwrap(shape);
      const keys = inner instanceof z.ZodObject ? Object.keys(inner.shape) : [];
      const key = camelKey(seg, keys);
      if (!key || !(inner instanceof z.ZodObject)) {
        problems.push(`${name}: ${[...path, seg.toLowerCase()].join(".")} is not a configuration key`);
        ok = false;
        break;
      }
      path.push(key);
      shape = (inner.shape as Record<string, z.ZodType>)[key]!;
      if (i === segments.length - 1) {
        target[key] = parseYaml(raw) as unknown;
      } else {
        const next = target[key];
        if (typeof next !== "object" || next === null) target[key] = {};
        target = target[key] as Record<string, unknown>;
      }
    }
    void ok;
  }
}

function unwrap(t: z.ZodType): z.ZodType {
  let cur: z.ZodType = t;
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

export interface LoadOptions {
  /** Path of the YAML environment file; without it, the defaults. */
  file?: string | undefined;
  /** A document to merge over the file (tests use this). */
  overrides?: ConfigInput;
  env?: NodeJS.ProcessEnv;
  /** Folder that relative paths in the file are taken from; the working directory by default. */
  cwd?: string;
}

function deepMerge(a: Record<string, unknown>, b: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...a };
  for (const [k, v] of Object.entries(b)) {
    const cur = out[k];
    out[k] =
      v && typeof v === "object" && !Array.isArray(v) && cur && typeof cur === "object" && !Array.isArray(cur)
        ? deepMerge(cur as Record<string, unknown>, v as Record<string, unknown>)
        : v;
  }
  return out;
}

function deepFreeze<T>(o: T): T {
  if (o && typeof o === "object") {
    for (const v of Object.values(o)) deepFreeze(v);
    Object.freeze(o);
  }
  return o;
}

export function loadConfig(opts: LoadOptions = {}): Config {
  const source = opts.file ?? "defaults";
  let doc: Record<string, unknown> = {};
  if (opts.file) {
    let text: string;
    try {
      text = readFileSync(opts.file, "utf8");
    } catch (err) {
      throw new ConfigError(source, [`cannot read the file: ${(err as Error).message}`]);
    }
    let parsed: unknown;
    try {
      parsed = parseYaml(text);
    } catch (err) {
      throw new ConfigError(source, [`not valid YAML: ${(err as Error).message}`]);
    }
    if (parsed !== null && parsed !== undefined) {
      if (typeof parsed !== "object" || Array.isArray(parsed))
        throw new ConfigError(source, ["the file must hold a mapping of sections"]);
      doc = parsed as Record<string, unknown>;
    }
  }
  if (opts.overrides) doc = deepMerge(doc, opts.overrides);
  const problems: string[] = [];
  applyEnvOverrides(doc, opts.env ?? process.env, problems);
  if (problems.length) throw new ConfigError(source, problems);
  const result = configSchema.safeParse(doc);
  if (!result.success) throw new ConfigError(source, formatIssues(result.error.issues));
  const config = result.data;
  // an unset webhook URL is derived; one set to "" is empty, and token mode refuses it
  const hook = (doc.nats as { authCallout?: { workerTokenAuth?: { webhookUrl?: unknown } } } | undefined)
    ?.authCallout?.workerTokenAuth?.webhookUrl;
  // a cluster's work queues are replicated unless the file says otherwise: an unset
  // nats.stream.replicas is the cluster's size, at most 3 (one stays the default of one server)
  const replicasSet =
    (doc.nats as { stream?: { replicas?: unknown } } | undefined)?.stream?.replicas !== undefined;
  if (!replicasSet) config.nats.stream.replicas = Math.min(config.nats.cluster.size, 3);
  const clusterSizeSet =
    (doc.nats as { cluster?: { size?: unknown } } | undefined)?.cluster?.size !== undefined;
  const cross = crossFieldProblems(config, {
    webhookUrl: hook === "",
    natsUrl: config.nats.url === "",
    clusterSizeSet,
  });
  if (cross.length) throw new ConfigError(source, cross);
  resolveDerived(config, opts.cwd ?? process.cwd());
  const afterDerived = keyFileProblems(config);
  if (afterDerived.length) throw new ConfigError(source, afterDerived);
  return deepFreeze(config);
}
