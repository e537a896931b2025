// `callplane render`: the manifests of a whole control plane, from the environment file `npm start`
// uses. Every object is built with the typed models of kubernetes-models, @kubernetes-models/
// gateway-api and @kubernetes-models/cert-manager (so a misspelt field does not compile) and is
// validated against the schemas they carry (validate.ts). Nothing here reads a Secret's value:
// Secrets are referenced by name, and `callplane credentials generate` makes their contents.
//
// This entry checks the file against what a cluster needs (cluster-config.ts), then has each
// component's module render its file, in the order of the files (which is also the order the
// Secrets they reference are listed in).
import { planCluster } from "../cluster-config.js";
import { renderAdminIssuer } from "./admin-issuer.js";
import { renderAdmissionWebhook } from "./admission-webhook.js";
import { renderApi } from "./api.js";
import { renderAuthCallout } from "./auth-callout.js";
import { renderCallbackProxy } from "./callback-proxy.js";
import { renderCertificates } from "./certificates.js";
import { renderCompute } from "./compute.js";
import { RenderContext } from "./context.js";
import { renderGateway } from "./gateway.js";
import { renderGrpcProxy } from "./grpc-proxy.js";
import { renderInvocation } from "./invocation.js";
import { renderConfigMaps, renderNamespaces } from "./namespaces.js";
import { renderNats } from "./nats.js";
import { renderNetworkPolicies } from "./network-policies.js";
import { renderObservability } from "./observability.js";
import { RenderError, type RenderInput, type RenderResult, type RenderedFile } from "./types.js";

export { RenderError } from "./types.js";
export type { K8sObject, RenderInput, RenderResult, RenderedFile, SecretUse } from "./types.js";

export function renderControlPlane(input: RenderInput): RenderResult {
  const { config, raw, version } = input;
  const planned = planCluster(config, raw);
  if ("problems" in planned) throw new RenderError(input.source, planned.problems);
  return renderFiles(new RenderContext(config, planned, version));
}

/** One file per component, each only when its part is on. */
function renderFiles(k: RenderContext): RenderResult {
  const c = k.c;
  const files: RenderedFile[] = [
    { name: "00-namespaces.yaml", objects: renderNamespaces(k) },
    { name: "01-config.yaml", objects: renderConfigMaps(k) },
    { name: "02-certificates.yaml", objects: renderCertificates(k) },
  ];
  if (c.nats.server.enabled) files.push({ name: "10-nats.yaml", objects: renderNats(k) });
  files.push({ name: "11-nats-auth-callout.yaml", objects: renderAuthCallout(k) });
  files.push({ name: "20-api.yaml", objects: renderApi(k) });
  if (c.adminIssuerProxy.enabled) files.push({ name: "21-admin-issuer.yaml", objects: renderAdminIssuer(k) });
  files.push({ name: "30-invocation.yaml", objects: renderInvocation(k) });
  if (k.grpcOn) files.push({ name: "31-grpc-proxy.yaml", objects: renderGrpcProxy(k) });
  if (k.proxyOn) files.push({ name: "32-worker-callback-proxy.yaml", objects: renderCallbackProxy(k) });
  files.push({ name: "40-compute.yaml", objects: renderCompute(k) });
  if (k.kubeBackend) files.push({ name: "41-admission-webhook.yaml", objects: renderAdmissionWebhook(k) });
  if (c.ingress.gatewayApi.enabled) files.push({ name: "50-gateway.yaml", objects: renderGateway(k) });
  files.push({ name: "60-network-policies.yaml", objects: renderNetworkPolicies(k) });
  files.push({ name: "70-observability.yaml", objects: renderObservability(k) });
  return {
    namespace: k.ns,
    workerNamespace: k.workerNs,
    files,
    secrets: k.secrets.list(),
    notes: k.plan.notes,
  };
}
