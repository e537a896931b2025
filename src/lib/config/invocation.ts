// The invocation service's section, and its rules: replicas behind one callback address need the
// relay, and the default poll window fits in the longest.
import { z } from "zod";
import { cidr, optionalUrl, seconds, section } from "./fields.js";
import type { GlobalConfig } from "./global.js";
import { autoscaling, podAnnotations, resources } from "./kubernetes.js";

export const invocationSection = section({
  replicaCount: z.number().int().min(1).max(250).default(2),
  podAnnotations: podAnnotations(),
  resources: resources("250m", "256Mi", "1Gi"),
  autoscaling: autoscaling(),
  podNetwork: cidr.default("127.0.1.0/24"),
  port: z.number().int().min(0).max(65535).default(8080),
  selfAddress: optionalUrl(["http", "https"]),
  inlineBodyBytes: z
    .number()
    .int()
    .min(0)
    .max(4 * 1024 * 1024)
    .default(32 * 1024),
  poll: section({
    defaultSeconds: z.number().int().min(1).max(3600).default(60),
    streamingDefaultSeconds: z.number().int().min(1).max(3600).default(1200),
    maxSeconds: z.number().int().min(1).max(3600).default(3600),
    graceSeconds: seconds(2, 60),
  }),
  statusRequestTimeoutSeconds: seconds(5, 60),
  authCache: section({
    ttlSeconds: z
      .number()
      .positive()
      .max(30, "must be at most 30 (a revoked key must be refused within 30 s)")
      .default(10),
    negativeTtlSeconds: z.number().positive().max(30).default(5),
    maxEntries: z.number().int().positive().default(10_000),
  }),
  maxInFlightPerKey: z.number().int().min(1).max(1_000_000).default(1024),
  // The inline part of a body must arrive within this (and within the poll window), and no byte of
  // a body may be missing for bodyIdleSeconds while a reader waits for it: a trickled body would
  // otherwise hold its connection (and, once a worker reads it, a worker slot) for the whole window.
  inlineBodySeconds: seconds(30, 3600),
  bodyIdleSeconds: seconds(10, 3600),
  // The contract's plaintext pod port takes workers' callbacks; off when every worker calls back
  // through the callback proxy to the worker TLS listener.
  attachOnClientPort: z.boolean().default(true),
  // null (unset): off, except on the one-machine stack, which turns it on (every port there is loopback).
  metricsOnClientPort: z.boolean().nullable().default(null),
  shutdownGraceSeconds: seconds(30, 3600),
  drainDelaySeconds: z.number().min(0).max(300).default(5),
  relay: section({
    enabled: z.boolean().default(true),
  }),
});

export type InvocationConfig = z.output<typeof invocationSection>;

/** Several replicas behind one callback URL: a callback may reach a replica that does not hold the request. */
export function invocationRelayProblems(c: { invocation: InvocationConfig; global: GlobalConfig }): string[] {
  const p: string[] = [];
  const we = c.global.workerEndpoints;
  if (
    c.invocation.replicaCount > 1 &&
    (we.invocationServiceURL || c.invocation.selfAddress) &&
    !c.invocation.relay.enabled
  ) {
    p.push(
      `invocation.replicaCount is ${c.invocation.replicaCount} with a shared callback URL (${we.invocationServiceURL ? "global.workerEndpoints.invocationServiceURL" : "invocation.selfAddress"}) ` +
        "and invocation.relay.enabled is false: a callback balanced to a replica that does not hold the request would be dropped. " +
        "Turn invocation.relay.enabled on, or set invocation.replicaCount to 1",
    );
  }
  return p;
}

/** Workers need somewhere to call back: the client port, or the worker TLS listener behind the callback proxy. */
export function attachProblems(c: {
  invocation: InvocationConfig;
  workerCallbackProxy: { enabled: boolean; invocation: { upstreamTls: { enabled: boolean } } };
}): string[] {
  if (c.invocation.attachOnClientPort) return [];
  const p: string[] = [];
  const proxy = c.workerCallbackProxy;
  if (!proxy.enabled || !proxy.invocation.upstreamTls.enabled) {
    p.push(
      "invocation.attachOnClientPort is false, but workers call back to the client port: the worker TLS listener needs " +
        "workerCallbackProxy.enabled and workerCallbackProxy.invocation.upstreamTls.enabled. Turn those on, or invocation.attachOnClientPort",
    );
  }
  if (c.invocation.relay.enabled) {
    p.push(
      "invocation.attachOnClientPort is false and invocation.relay.enabled is true: the relay forwards callbacks to the " +
        "holding replica's client port, which would refuse them. Turn invocation.relay.enabled off (with a pod address per " +
        "replica through the callback proxy, callbacks reach their holder without it), or invocation.attachOnClientPort on",
    );
  }
  return p;
}

export function pollProblems(c: { invocation: InvocationConfig }): string[] {
  const p: string[] = [];
  if (c.invocation.poll.defaultSeconds > c.invocation.poll.maxSeconds) {
    p.push("invocation.poll.defaultSeconds is larger than invocation.poll.maxSeconds");
  }
  return p;
}
