// The API's section (and apikeys and ess, the upstream services it serves, which only carry pod
// annotations), and the rule that ties its database driver to its URL.
import { z } from "zod";
import { hostPort, optionalUrl, section } from "./fields.js";
import { podAnnotations, resources } from "./kubernetes.js";

export const apiSection = section({
  replicaCount: z.number().int().min(1).max(50).default(1),
  podAnnotations: podAnnotations(),
  resources: resources("100m", "256Mi", "512Mi"),
  listen: hostPort.default("127.0.0.1:8080"),
  url: optionalUrl(["http", "https"]),
  maxBodyBytes: z
    .number()
    .int()
    .positive()
    .default(1024 * 1024),
  database: section({
    driver: z.enum(["sqlite", "postgres"]).default("sqlite"),
    path: z.string().default(""),
    url: optionalUrl(["postgres", "postgresql"]),
    maxConnections: z.number().int().min(1).max(1000).default(10),
  }),
  // the console's audit log (table audit_log): pruned past either bound when an action is recorded
  // and when the API starts
  audit: section({
    maxRows: z.number().int().min(1).max(100_000_000).default(100_000),
    maxAgeDays: z.number().int().min(1).max(36_500).default(365),
  }),
});

export const apikeysSection = section({
  podAnnotations: podAnnotations(),
  maxLifetimeDays: z.number().int().min(1).max(3650).default(365),
});
export const essSection = section({ podAnnotations: podAnnotations() });

export type ApiConfig = z.output<typeof apiSection>;

/**
 * The database driver and its URL go together. Checked where the database is used (the API's
 * start, and the local stack, which runs the API), not at every load: on Kubernetes every pod reads
 * one configuration, and only the API's pods are given the PostgreSQL URL (from a Secret).
 */
export function databaseProblems(c: { api: ApiConfig }): string[] {
  const p: string[] = [];
  const db = c.api.database;
  if (db.driver === "postgres" && !db.url)
    p.push(
      "api.database.driver is postgres but api.database.url is empty: set it to postgres://user:password@host:port/database",
    );
  if (db.driver === "sqlite" && db.url)
    p.push(
      `api.database.url is set (${db.url.replace(/\/\/[^@/]*@/, "//…@")}) but api.database.driver is sqlite: set api.database.driver to postgres, or clear api.database.url`,
    );
  return p;
}
