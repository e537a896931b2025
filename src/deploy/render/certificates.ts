// 02-certificates.yaml: cert-manager's Issuers and Certificates: the stack CA (self-signed unless
// the operator brings one), the NATS servers' certificate, the callback proxy's frontend, and the
// wildcard certificates the proxy checks the invocation and grpc-proxy pods by, and (kubernetes
// backend) the admission webhook's serving certificate.
import { Certificate, Issuer } from "@kubernetes-models/cert-manager/cert-manager.io/v1";
import { ADMISSION_WEBHOOK, ISSUERS, SERVICES, TLS_SECRETS } from "../layout.js";
import type { RenderContext } from "./context.js";
import type { K8sObject } from "./types.js";

function certificate(
  k: RenderContext,
  name: string,
  secretName: string,
  dnsNames: string[],
  opts: {
    usages?: Array<"server auth" | "client auth">;
    issuer?: { kind: string; name: string };
    duration?: string;
  } = {},
): Certificate {
  return new Certificate({
    metadata: k.meta(name),
    spec: {
      secretName,
      dnsNames,
      duration: opts.duration ?? "2160h",
      renewBefore: "720h",
      privateKey: { algorithm: "ECDSA", size: 256, rotationPolicy: "Always" },
      usages: opts.usages ?? ["server auth"],
      issuerRef: {
        group: "cert-manager.io",
        kind: opts.issuer?.kind ?? "Issuer",
        name: opts.issuer?.name ?? ISSUERS.ca,
      },
    },
  });
}

export function renderCertificates(k: RenderContext): K8sObject[] {
  const out: K8sObject[] = [];
  const f = k.plan.names.fqdn;
  if (!k.plan.ownCa) {
    out.push(
      new Issuer({ metadata: k.meta(ISSUERS.selfSigned), spec: { selfSigned: {} } }),
      new Certificate({
        metadata: k.meta(TLS_SECRETS.ca),
        spec: {
          isCA: true,
          commonName: "callplane stack CA",
          secretName: TLS_SECRETS.ca,
          duration: "87600h",
          privateKey: { algorithm: "ECDSA", size: 256 },
          issuerRef: { group: "cert-manager.io", kind: "Issuer", name: ISSUERS.selfSigned },
        },
      }),
    );
  } else {
    k.secrets.set(TLS_SECRETS.ca, {
      name: TLS_SECRETS.ca,
      keys: ["tls.crt", "tls.key"],
      usedBy: ["cert-manager (Issuer callplane-ca)", "every callplane pod (tls.crt only)"],
      how: "your stack CA (pki.caCertFile and pki.caKeyFile are set): kubectl create secret tls callplane-ca --cert <pki.caCertFile> --key <pki.caKeyFile>",
    });
  }
  out.push(new Issuer({ metadata: k.meta(ISSUERS.ca), spec: { ca: { secretName: TLS_SECRETS.ca } } }));
  if (k.c.nats.server.enabled) {
    const hosts = [
      SERVICES.nats,
      `${SERVICES.nats}.${k.ns}`,
      `${SERVICES.nats}.${k.ns}.svc`,
      f(SERVICES.nats),
      `*.${f(SERVICES.natsHeadless)}`,
    ];
    if (k.c.ingress.gatewayApi.enabled && k.c.ingress.gatewayApi.routes.nats.enabled)
      hosts.push(`nats.${k.c.ingress.gatewayApi.domain}`);
    // client auth too: the servers' routes verify each other with these certificates
    out.push(
      certificate(k, "nats-server", TLS_SECRETS.nats, hosts, { usages: ["server auth", "client auth"] }),
    );
  }
  if (k.proxyOn) {
    const fr = k.c.workerCallbackProxy.tls.frontend;
    const wd = k.c.workerCallbackProxy.workerDomain;
    if (!fr.existingSecret) {
      out.push(
        certificate(
          k,
          "worker-callback-proxy-frontend",
          TLS_SECRETS.proxyFrontend,
          [`*.${wd}`, wd],
          fr.certificate.issuerRef.name
            ? { issuer: { kind: fr.certificate.issuerRef.kind, name: fr.certificate.issuerRef.name } }
            : {},
        ),
      );
    }
    // Pod certificates: one wildcard per service, as upstream's (seed: worker-callback-proxy.md).
    // A pod's IP is known only once it runs, and cert-manager cannot put it in a certificate
    // (its CSI driver mounts volumes before the IP exists); the proxy checks the name
    // <dashed-ip>.invocation.<serviceDomain>, which the wildcard covers, and dials the IP in it.
    if (k.upstreamTls)
      out.push(
        certificate(k, "invocation-service-worker-tls", TLS_SECRETS.invocationPods, [
          `*.${f(SERVICES.invocationHeadless)}`,
        ]),
      );
    if (k.grpcOn)
      out.push(
        certificate(k, "grpc-proxy-worker-tls", TLS_SECRETS.grpcPods, [`*.${f(SERVICES.grpcHeadless)}`]),
      );
  }
  if (k.kubeBackend) {
    // The API server dials <service>.<namespace>.svc and checks the certificate against the CA that
    // cert-manager injects into the ValidatingWebhookConfiguration (cert-manager.io/inject-ca-from)
    const svc = ADMISSION_WEBHOOK.service;
    out.push(
      certificate(k, ADMISSION_WEBHOOK.certificate, TLS_SECRETS.webhook, [
        svc,
        `${svc}.${k.ns}`,
        `${svc}.${k.ns}.svc`,
        f(svc),
      ]),
    );
  }
  return out;
}
