// The admission webhook's section (the kubernetes compute backend only): where it listens, its
// TLS certificate, whose requests count as the compute agent's, and its pods when rendered.
import { z } from "zod";
import { hostPort, section } from "./fields.js";
import { podAnnotations, resources } from "./kubernetes.js";

/**
 * The compute agent's ServiceAccount in the control plane's namespace (render's Deployment and
 * ServiceAccount `compute-agent`): the one identity that may use the reserved worker accounts.
 */
export const COMPUTE_AGENT_ACCOUNT = "compute-agent";

/**
 * How the webhook stops (fixed, not configured): it keeps answering for `drainDelaySeconds` after
 * its readiness failed, while the Service lets go of the pod (the API server's calls still arrive,
 * and one unanswered is a refused pod: failure policy Fail), then finishes within `graceSeconds`.
 */
export const ADMISSION_WEBHOOK_STOP = { drainDelaySeconds: 5, graceSeconds: 10 } as const;

export const admissionWebhookSection = section({
  podAnnotations: podAnnotations(),
  resources: resources("50m", "64Mi", "256Mi"),
  listen: hostPort.default("127.0.0.1:8443"),
  // "": the rendered Certificate's Secret (cert-manager) in a pod; required elsewhere
  tls: section({
    certFile: z.string().default(""),
    keyFile: z.string().default(""),
  }),
  // "": system:serviceaccount:<the namespace of global.serviceDomain>:compute-agent
  agentUsername: z.string().max(253).default(""),
  replicas: z.number().int().min(1).max(10).default(2),
});

export type AdmissionWebhookConfig = z.output<typeof admissionWebhookSection>;

/**
 * The username the API server gives the compute agent's requests: admissionWebhook.agentUsername,
 * or the agent's ServiceAccount in the control plane's namespace, which global.serviceDomain names
 * (`<namespace>.svc.<cluster domain>`, as `callplane render` reads it).
 */
export function computeAgentUsername(c: {
  global: { serviceDomain: string };
  admissionWebhook: { agentUsername: string };
}): string {
  if (c.admissionWebhook.agentUsername) return c.admissionWebhook.agentUsername;
  const m = /^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)\.svc\./.exec(c.global.serviceDomain);
  if (!m)
    throw new Error(
      `admissionWebhook.agentUsername is empty and global.serviceDomain (${c.global.serviceDomain}) is not <namespace>.svc.<cluster domain>, so the compute agent's namespace is unknown: set admissionWebhook.agentUsername to its username (system:serviceaccount:<namespace>:${COMPUTE_AGENT_ACCOUNT})`,
    );
  return `system:serviceaccount:${m[1]}:${COMPUTE_AGENT_ACCOUNT}`;
}
