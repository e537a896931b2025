// 11-nats-auth-callout.yaml: the NATS auth callout service, which decides every NATS login; its pods
// restart when the worker auth mode or its webhook changes, since it reads them once at start-up.
import { basename } from "node:path";
import { KEY_FILES } from "../../lib/nats/index.js";
import { MOUNTS, WORKLOADS } from "../layout.js";
import { sha256, type RenderContext } from "./context.js";
import { baseVolumes, caVolume, container, natsKeyVolume, podSpec, roleKey, tokenVolume } from "./pod.js";
import type { K8sObject } from "./types.js";
import { deployment, serviceAccount } from "./workload.js";

export function renderAuthCallout(k: RenderContext): K8sObject[] {
  const w = WORKLOADS.callout;
  const base = baseVolumes();
  const keys = natsKeyVolume(k, w, [
    roleKey("nats-auth-callout"),
    basename(KEY_FILES.calloutIssuer("/")),
    // nkey logins are checked against the shared worker key, in either mode
    basename(KEY_FILES.worker("/")),
  ]);
  const tokens = tokenVolume(k, w, ["nats-auth-callout"]);
  const mode = k.c.nats.workerAuth;
  const spec = podSpec(
    k,
    w,
    [
      container(k, w, {
        ports: [],
        mounts: [
          ...base.mounts,
          keys.mount,
          tokens.mount,
          { name: "stack-ca", mountPath: MOUNTS.ca, readOnly: true },
        ],
      }),
    ],
    [...base.volumes, keys.volume, tokens.volume, caVolume()],
  );
  return [
    serviceAccount(k, w),
    deployment(k, w, spec, {
      replicas: 1,
      // it reads its plugins once, at start-up: a change of mode or webhook restarts it
      annotations: {
        "nvcf.nvidia.com/nats-worker-auth": mode,
        "nvcf.nvidia.com/nats-worker-auth-webhook": sha256(
          mode === "token" ? k.c.nats.authCallout.workerTokenAuth.webhookUrl : "",
        ).slice(0, 16),
      },
    }),
  ];
}
