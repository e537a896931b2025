// The whole environment file's schema: its sections, in the order they are checked (and their
// problems listed) in. Each section's fields and defaults live in its own module.
import { z } from "zod";
import { adminIssuerProxySection } from "./admin-issuer.js";
import { admissionWebhookSection } from "./admission-webhook.js";
import { apiSection, apikeysSection, essSection } from "./api.js";
import { authSection } from "./auth.js";
import { natsAuthCalloutServiceSection } from "./auth-callout.js";
import { workerCallbackProxySection } from "./callback-proxy.js";
import { computeSection } from "./compute.js";
import { globalSection, logSection } from "./global.js";
import { grpcproxySection } from "./grpc-proxy.js";
import { invocationSection } from "./invocation.js";
import { ingressSection, kubernetesSection } from "./kubernetes.js";
import { natsSection } from "./nats.js";
import { observabilitySection } from "./observability.js";
import { pkiSection } from "./pki.js";
import { secretsSection } from "./secrets.js";
import { workerSection } from "./worker.js";

export const configSchema = z.strictObject({
  global: globalSection,
  log: logSection,
  nats: natsSection,
  api: apiSection,
  apikeys: apikeysSection,
  ess: essSection,
  natsAuthCalloutService: natsAuthCalloutServiceSection,
  adminIssuerProxy: adminIssuerProxySection,
  secrets: secretsSection,
  auth: authSection,
  invocation: invocationSection,
  worker: workerSection,
  pki: pkiSection,
  workerCallbackProxy: workerCallbackProxySection,
  grpcproxy: grpcproxySection,
  compute: computeSection,
  admissionWebhook: admissionWebhookSection,
  ingress: ingressSection,
  kubernetes: kubernetesSection,
  observability: observabilitySection,
});

export type Config = z.infer<typeof configSchema>;
export type ConfigInput = z.input<typeof configSchema>;
