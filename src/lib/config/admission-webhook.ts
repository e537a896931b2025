// The admission webhook's section (the kubernetes compute backend only): where it listens, its
// TLS certificate, and its pods when rendered.
import { z } from "zod";
import { hostPort, section } from "./fields.js";
import { podAnnotations, resources } from "./kubernetes.js";

export const admissionWebhookSection = section({
  podAnnotations: podAnnotations(),
  resources: resources("50m", "64Mi", "256Mi"),
  listen: hostPort.default("127.0.0.1:8443"),
  // "": the rendered Certificate's Secret (cert-manager) in a pod; required elsewhere
  tls: section({
    certFile: z.string().default(""),
    keyFile: z.string().default(""),
  }),
  replicas: z.number().int().min(1).max(10).default(2),
});

export type AdmissionWebhookConfig = z.output<typeof admissionWebhookSection>;
