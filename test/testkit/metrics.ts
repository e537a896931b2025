// Reading what a service's GET /metrics says, as Prometheus would: the families (# TYPE lines) and
// every sample with its labels. Tests assert on these, not on a registry's internals.
import { setTimeout as sleep } from "node:timers/promises";

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface Scrape {
  /** family name → type (counter, gauge, histogram, summary, untyped) */
  types: Map<string, string>;
  samples: Sample[];
  text: string;
}

function parseLabels(text: string): Record<string, string> {
  const labels: Record<string, string> = {};
  const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const m of text.matchAll(re))
    labels[m[1]] = m[2].replace(/\\(.)/g, (_, c: string) => (c === "n" ? "\n" : c));
  return labels;
}

/** Parses the Prometheus text format (version 0.0.4). */
export function parseMetrics(text: string): Scrape {
  const types = new Map<string, string>();
  const samples: Sample[] = [];
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    if (line.startsWith("#")) {
      const t = /^# TYPE (\S+) (\S+)/.exec(line);
      if (t) types.set(t[1], t[2]);
      continue;
    }
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)/.exec(line);
    if (!m) throw new Error(`not a sample line: ${line}`);
    samples.push({ name: m[1], labels: m[2] ? parseLabels(m[2]) : {}, value: Number(m[3]) });
  }
  return { types, samples, text };
}

export async function scrape(url: string): Promise<Scrape> {
  const r = await fetch(url);
  const text = await r.text();
  if (r.status !== 200) throw new Error(`${url} answered ${r.status}: ${text.slice(0, 200)}`);
  return parseMetrics(text);
}

/** The samples of `name` whose labels include `labels`. */
export function samplesOf(s: Scrape, name: string, labels: Record<string, string> = {}): Sample[] {
  return s.samples.filter(
    (x) => x.name === name && Object.entries(labels).every(([k, v]) => x.labels[k] === v),
  );
}

/** The sum of the matching samples (0 when none match). */
export function valueOf(s: Scrape, name: string, labels: Record<string, string> = {}): number {
  return samplesOf(s, name, labels).reduce((n, x) => n + x.value, 0);
}

/** The family a sample belongs to: a histogram's _bucket, _sum and _count lines name their family. */
export function familyOf(s: Scrape, sampleName: string): string {
  if (s.types.has(sampleName)) return sampleName;
  const m = /^(.*)_(bucket|sum|count)$/.exec(sampleName);
  if (m && s.types.has(m[1])) return m[1];
  return sampleName;
}

/** Scrapes `url` until `ok` holds of the scrape (the last scrape is returned), or fails after `ms`. */
export async function scrapeUntil(
  url: string,
  what: string,
  ok: (s: Scrape) => boolean,
  ms = 30_000,
): Promise<Scrape> {
  const deadline = Date.now() + ms;
  for (;;) {
    const s = await scrape(url);
    if (ok(s)) return s;
    if (Date.now() > deadline) throw new Error(`${url}: ${what} did not happen within ${ms} ms`);
    await sleep(200);
  }
}
