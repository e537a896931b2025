// The NATS auth callout service's section: its pods and its logging.
import { z } from "zod";
import { section } from "./fields.js";
import { podAnnotations, resources } from "./kubernetes.js";

export const natsAuthCalloutServiceSection = section({
  podAnnotations: podAnnotations(),
  resources: resources("50m", "64Mi", "256Mi"),
  serviceConfig: section({
    logging: section({
      level: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
      sampling: section({
        initial: z.number().int().min(0).default(100),
        thereafter: z.number().int().min(1).default(100),
      }),
    }),
  }),
});
