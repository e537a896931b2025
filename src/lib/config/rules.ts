// The rules that relate fields, run right after the schema; each message names every field involved.
// Each rule lives beside its section; this runs them in one fixed order, so a file with several
// problems lists them the same way every time.
import { issuerListenProblems } from "./admin-issuer.js";
import {
  connectProblems,
  frontendProblems,
  invocationProxyUrlProblems,
  splitPlaneProblems,
} from "./callback-proxy.js";
import { restartBackoffProblems, tokenSourceProblems } from "./compute.js";
import { grpcProxyProblems } from "./grpc-proxy.js";
import { attachProblems, invocationRelayProblems, pollProblems } from "./invocation.js";
import { autoscalingProblems } from "./kubernetes.js";
import { natsProblems } from "./nats.js";
import { tracingProblems } from "./observability.js";
import type { Config } from "./schema.js";
import { mekProblems } from "./secrets.js";

/** Rules that relate fields; each message names every field involved. */
export function crossFieldProblems(
  c: Config,
  explicitlyEmpty: { webhookUrl: boolean; natsUrl: boolean; clusterSizeSet: boolean },
): string[] {
  return [
    ...invocationRelayProblems(c),
    ...attachProblems(c),
    ...issuerListenProblems(c),
    ...splitPlaneProblems(c),
    ...invocationProxyUrlProblems(c),
    ...mekProblems(c),
    ...natsProblems(c, explicitlyEmpty),
    ...grpcProxyProblems(c),
    ...restartBackoffProblems(c),
    ...tokenSourceProblems(c),
    ...pollProblems(c),
    ...autoscalingProblems(c),
    ...frontendProblems(c),
    ...connectProblems(c),
    ...tracingProblems(c),
  ];
}
