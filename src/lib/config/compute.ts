// The compute agent's section, and its rule on the restart backoff.
import { z } from "zod";
import { cidr, hostPort, seconds, section } from "./fields.js";
import { podAnnotations, resources } from "./kubernetes.js";

export const computeSection = section({
  backend: z.enum(["local"]).default("local"),
  podAnnotations: podAnnotations(),
  resources: resources("100m", "256Mi", "1Gi"),
  local: section({
    // off: a function could run any command line on the agent's machine (see docs/errors.md)
    allowCommand: z.boolean().default(false),
    // "": the system user callplane-fn when the agent runs as root, else the agent's own user
    runAs: z
      .string()
      .regex(/^$|^[a-z_][a-z0-9_-]*[$]?$/i, "must be empty or a user name (letters, digits, _ and -)")
      .max(32)
      .default(""),
  }),
  secrets: section({
    dir: z.string().default(""),
    env: z.boolean().default(false),
  }),
  listen: hostPort.default("127.0.0.1:8082"),
  instanceNetwork: cidr.default("127.0.3.0/24"),
  syncIntervalSeconds: seconds(2, 600),
  stopGraceSeconds: seconds(10, 600),
  restartBackoff: section({
    initialSeconds: seconds(1, 600),
    maxSeconds: seconds(30, 3600),
  }),
  workerIdentity: section({
    // "" is the default source, never "off": no worker starts without an identity
    tokenSource: z.enum(["", "api"], { error: 'must be "" (the default source) or api' }).default(""),
    clusterId: z
      .string()
      .regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/, "must be letters, digits, dots, dashes and underscores")
      .default("local"),
    tokenTtlSeconds: z.number().int().min(30).max(3600).default(900),
  }),
});

export type ComputeConfig = z.output<typeof computeSection>;

export function restartBackoffProblems(c: { compute: ComputeConfig }): string[] {
  const p: string[] = [];
  if (c.compute.restartBackoff.initialSeconds > c.compute.restartBackoff.maxSeconds) {
    p.push("compute.restartBackoff.initialSeconds is larger than compute.restartBackoff.maxSeconds");
  }
  return p;
}
