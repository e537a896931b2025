// What an operator applies before the kubernetes compute backend can run, taken from what
// `callplane render` writes for examples/kubernetes.yaml: the two namespaces, the compute agent's
// ServiceAccount, Role, RoleBinding, ClusterRole and binding, and (when a webhook is given) the
// ValidatingWebhookConfiguration, its clientConfig pointed at an in-process webhook on loopback
// (the API server here reaches no Service) with that webhook's CA as caBundle (what cert-manager
// would inject). Then a token for the agent's own account, written to a file as a projected token
// would be: the agent runs with exactly the rendered permissions.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { renderFile } from "../../src/deploy/index.js";
import { KubeError, kubePaths, type KubeObject } from "../../src/lib/kube/index.js";
import {
  createAdmissionWebhook,
  type AdmissionWebhook,
} from "../../src/services/admission-webhook/service.js";
import type { KubeApiServer } from "./kube-apiserver.js";
import { repoRoot } from "./paths.js";
import { tmpDir } from "./scope.js";
import { testPki } from "./tls.js";

/** examples/kubernetes.yaml's namespaces: the control plane's and the workers'. */
export const CONTROL_NS = "nvcf";
export const WORKERS_NS = "callplane-workers";
export const AGENT_ACCOUNT = "compute-agent";
export const AGENT_USERNAME = `system:serviceaccount:${CONTROL_NS}:${AGENT_ACCOUNT}`;

export interface TestWebhook {
  hook: AdmissionWebhook;
  /** https://127.0.0.1:<port> */
  url: URL;
  /** The CA of its certificate (what cert-manager would inject as the registration's caBundle). */
  caPem: string;
}

/**
 * The admission webhook in this process, on loopback, with a certificate for 127.0.0.1 and
 * localhost from a CA of its own; destroyed when the test ends.
 */
export async function startTestWebhook(
  t: Pick<TestContext, "after">,
  agentUsername = AGENT_USERNAME,
): Promise<TestWebhook> {
  const pki = await testPki();
  const cert = await pki.issue(["localhost", "127.0.0.1"]);
  const dir = tmpDir(t, "callplane-webhook-");
  writeFileSync(join(dir, "tls.crt"), cert.certPem);
  writeFileSync(join(dir, "tls.key"), cert.keyPem);
  const hook = createAdmissionWebhook({
    listen: { host: "127.0.0.1", port: 0 },
    tls: { certFile: join(dir, "tls.crt"), keyFile: join(dir, "tls.key") },
    agentUsername,
  });
  const url = await hook.listen();
  t.after(() => hook.destroy());
  return { hook, url, caPem: pki.ca.certPem };
}

export interface RenderedSetup {
  /** A file holding a token of the agent's account (an hour), for compute.kubernetes.tokenFile. */
  agentTokenFile: string;
  objects: KubeObject[];
}

export async function applyRenderedSetup(
  k: KubeApiServer,
  opts: { webhook?: TestWebhook } = {},
): Promise<RenderedSetup> {
  const rendered = renderFile(join(repoRoot, "examples", "kubernetes.yaml"), { version: "0.0.0-test" });
  const objects = rendered.files.flatMap((f) => f.objects.map((o) => o.toJSON() as KubeObject));
  const pick = (kind: string, name?: string) => {
    const o = objects.filter((x) => x.kind === kind && (name === undefined || x.metadata?.name === name));
    if (!o.length) throw new Error(`render wrote no ${kind} ${name ?? ""}`);
    return o;
  };
  const setup = [
    ...pick("Namespace"),
    ...pick("ServiceAccount", AGENT_ACCOUNT),
    ...pick("Role", AGENT_ACCOUNT),
    ...pick("RoleBinding", AGENT_ACCOUNT),
    ...pick("ClusterRole"),
    ...pick("ClusterRoleBinding"),
  ];
  if (opts.webhook) {
    const [registration] = pick("ValidatingWebhookConfiguration") as Array<
      KubeObject & { webhooks: Array<Record<string, unknown>> }
    >;
    for (const w of registration.webhooks)
      w.clientConfig = {
        url: `${opts.webhook.url.origin}/validate`,
        caBundle: Buffer.from(opts.webhook.caPem).toString("base64"),
      };
    setup.push(registration);
  }
  for (const r of await k.apply(setup))
    if (r.error) throw new Error(`applying the rendered setup: ${r.path}: ${r.error.message}`);
  if (opts.webhook) await webhookCalled(k);
  const agentTokenFile = k.writeTokenFile(
    await k.tokenFor(CONTROL_NS, AGENT_ACCOUNT, { expirationSeconds: 3600 }),
  );
  return { agentTokenFile, objects };
}

/** The API server picks a registration up from its informer: a dry run says when it calls it. */
async function webhookCalled(k: KubeApiServer): Promise<void> {
  // (the ServiceAccount admission plugin, before any webhook, refuses a pod whose account is missing)
  await k.createServiceAccount(WORKERS_NS, "nvcf-worker-probe");
  const probe = {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name: "webhook-probe" },
    spec: {
      serviceAccountName: "nvcf-worker-probe",
      automountServiceAccountToken: false,
      containers: [{ name: "c", image: "example.invalid/none:1" }],
    },
  };
  const deadline = Date.now() + 30_000;
  for (;;) {
    const err = await k.admin.create(kubePaths.pods(WORKERS_NS), probe, { query: { dryRun: "All" } }).then(
      () => undefined,
      (e: unknown) => e,
    );
    if (err instanceof KubeError && err.message.includes("admission webhook")) break;
    if (Date.now() > deadline) throw new Error(`the webhook was never called: ${String(err)}`);
    await sleep(200);
  }
  await k.admin.delete(kubePaths.serviceAccounts(WORKERS_NS, "nvcf-worker-probe"));
}
