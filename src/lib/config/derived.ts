// Values that default from other values: paths under the data folder, URLs from listen addresses.
// They are filled in after the rules have run, in an order where each takes what it derives from
// already filled in (api.url before the webhook URL, pki.dir before the certificates under it).
import { isAbsolute, resolve } from "node:path";
import { natsNodes } from "../nats/index.js";
import { parseHostPort } from "../net/index.js";
import type { Config } from "./schema.js";

/** Fills in values that default from other values (paths under the data folder, URLs from listen addresses). */
export function resolveDerived(c: Config, cwd: string): void {
  const abs = (p: string) => (isAbsolute(p) ? p : resolve(cwd, p));
  c.global.dataDir = abs(c.global.dataDir);
  const data = c.global.dataDir;
  c.api.database.path = c.api.database.path ? abs(c.api.database.path) : resolve(data, "callplane.db");
  c.auth.adminSigningKeyFile = c.auth.adminSigningKeyFile
    ? abs(c.auth.adminSigningKeyFile)
    : resolve(data, "keys", "admin-signing.key.pem");
  c.auth.adminPublicKeyFile = c.auth.adminPublicKeyFile
    ? abs(c.auth.adminPublicKeyFile)
    : resolve(data, "keys", "admin-signing.pub.pem");
  c.auth.serviceTokenDir = c.auth.serviceTokenDir ? abs(c.auth.serviceTokenDir) : resolve(data, "secrets");
  const ai = c.adminIssuerProxy;
  ai.operatorCredentialFile = ai.operatorCredentialFile
    ? abs(ai.operatorCredentialFile)
    : resolve(data, "keys", "issuer-operator.secret");
  ai.signingKeyFile = ai.signingKeyFile
    ? abs(ai.signingKeyFile)
    : resolve(data, "keys", "admin-issuer.key.pem");
  ai.publicKeyFile = ai.publicKeyFile ? abs(ai.publicKeyFile) : resolve(data, "keys", "admin-issuer.pub.pem");
  c.secrets.mek.file = c.secrets.mek.file ? abs(c.secrets.mek.file) : resolve(data, "keys", "mek.json");
  if (c.secrets.mek.plugin) c.secrets.mek.plugin = abs(c.secrets.mek.plugin);
  if (c.compute.secrets.dir) c.compute.secrets.dir = abs(c.compute.secrets.dir);
  if (c.nats.server.binary) c.nats.server.binary = abs(c.nats.server.binary);
  if (!c.api.url) c.api.url = `http://${c.api.listen}`;
  c.auth.workerIdentityKeyFile = c.auth.workerIdentityKeyFile
    ? abs(c.auth.workerIdentityKeyFile)
    : resolve(data, "keys", "worker-identity.key.pem");
  c.nats.credentialsDir = c.nats.credentialsDir
    ? abs(c.nats.credentialsDir)
    : resolve(data, "secrets", "nats");
  c.nats.authCallout.workerTokenAuth.webhookUrl ||= `${c.api.url.replace(/\/+$/, "")}/v2/nvcf/webhook/nats-auth`;
  if (!c.adminIssuerProxy.url) c.adminIssuerProxy.url = `http://${c.adminIssuerProxy.listen}`;
  c.pki.dir = c.pki.dir ? abs(c.pki.dir) : resolve(data, "pki");
  c.pki.caCertFile = c.pki.caCertFile ? abs(c.pki.caCertFile) : resolve(c.pki.dir, "ca.crt");
  c.pki.caKeyFile = c.pki.caKeyFile ? abs(c.pki.caKeyFile) : resolve(c.pki.dir, "ca.key");
  if (!c.nats.url)
    c.nats.url = natsNodes(c.nats)
      .map((n) => n.url)
      .join(",");
  const ctls = c.nats.cluster.tls;
  ctls.certFile = ctls.certFile ? abs(ctls.certFile) : resolve(c.pki.dir, "nats-route", "tls.crt");
  ctls.keyFile = ctls.keyFile ? abs(ctls.keyFile) : resolve(c.pki.dir, "nats-route", "tls.key");
  const ntls = c.nats.tls;
  ntls.certFile = ntls.certFile ? abs(ntls.certFile) : resolve(c.pki.dir, "nats", "tls.crt");
  ntls.keyFile = ntls.keyFile ? abs(ntls.keyFile) : resolve(c.pki.dir, "nats", "tls.key");
  ntls.caFile = ntls.caFile ? abs(ntls.caFile) : c.pki.caCertFile;
  const front = c.workerCallbackProxy.tls.frontend;
  front.certFile = front.certFile ? abs(front.certFile) : resolve(c.pki.dir, "proxy", "tls.crt");
  front.keyFile = front.keyFile ? abs(front.keyFile) : resolve(c.pki.dir, "proxy", "tls.key");
  const gt = c.grpcproxy.tls;
  if (gt.certFile) gt.certFile = abs(gt.certFile);
  if (gt.keyFile) gt.keyFile = abs(gt.keyFile);
  if (c.observability.tracing.file) c.observability.tracing.file = abs(c.observability.tracing.file);
  if (c.workerCallbackProxy.enabled && !c.global.workerEndpoints.invocationProxyURL) {
    c.global.workerEndpoints.invocationProxyURL = `https://invocation.${c.workerCallbackProxy.workerDomain}:${parseHostPort(c.workerCallbackProxy.listen).port}`;
  }
}
