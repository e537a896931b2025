// The stack's own PKI: a CA generated on first start (or supplied by the operator) that issues the
// certificates worker callbacks need: each invocation replica's worker listener
// (<dashed-ip>.invocation.<service domain>, the pod name the proxy verifies) and the callback
// proxy's frontend (*.<workerDomain>). Certificates are written the way a Kubernetes TLS Secret
// mounts them: a folder with tls.crt, tls.key and ca.crt.
import "reflect-metadata";
import * as x509 from "@peculiar/x509";
import { X509Certificate, createPrivateKey, randomBytes, webcrypto } from "node:crypto";

type CryptoKey = webcrypto.CryptoKey;
import { existsSync, readFileSync } from "node:fs";
import { isIPv4 } from "node:net";
import { join } from "node:path";
import { writeFileAtomic } from "../fs.js";
import { podHost } from "../net/index.js";

x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

const ALG = { name: "ECDSA", namedCurve: "P-256", hash: "SHA-256" } as const;
const DAY = 86_400_000;

export interface CaMaterial {
  certPem: string;
  keyPem: string;
}

export interface CertInfo {
  subject: string;
  issuer: string;
  dnsNames: string[];
  ipAddresses: string[];
  notBefore: Date;
  notAfter: Date;
  fingerprint256: string;
  serialNumber: string;
}

function serial(): string {
  const b = randomBytes(16);
  b[0] = b[0] & 0x7f; // positive
  return b.toString("hex");
}

async function exportKeyPem(key: CryptoKey): Promise<string> {
  const der = Buffer.from(await webcrypto.subtle.exportKey("pkcs8", key));
  return createPrivateKey({ key: der, format: "der", type: "pkcs8" })
    .export({ type: "pkcs8", format: "pem" })
    .toString();
}

async function importKeyPem(pem: string): Promise<CryptoKey> {
  const der = createPrivateKey(pem).export({ type: "pkcs8", format: "der" });
  return webcrypto.subtle.importKey("pkcs8", der, ALG, true, ["sign"]);
}

export async function createCa(commonName = "callplane stack CA", days = 3650): Promise<CaMaterial> {
  const keys = await webcrypto.subtle.generateKey(ALG, true, ["sign", "verify"]);
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial(),
    name: `CN=${commonName}`,
    notBefore: new Date(now - 60_000),
    notAfter: new Date(now + days * DAY),
    keys,
    signingAlgorithm: ALG,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return { certPem: cert.toString("pem"), keyPem: await exportKeyPem(keys.privateKey) };
}

/**
 * Issues a server certificate (serverAuth) for DNS names and IPv4 addresses, signed by the CA.
 * `clientAuth` adds that use too, for a peer that presents the same certificate on the connections
 * it opens (a NATS cluster's routes are mutual TLS).
 */
export async function issueServerCert(
  ca: CaMaterial,
  dnsNames: string[],
  opts: { days?: number; notBefore?: Date; notAfter?: Date; clientAuth?: boolean } = {},
): Promise<{ certPem: string; keyPem: string }> {
  if (dnsNames.length === 0) throw new Error("a server certificate needs at least one DNS name");
  const caCert = new x509.X509Certificate(ca.certPem);
  const caKey = await importKeyPem(ca.keyPem);
  const keys = await webcrypto.subtle.generateKey(ALG, true, ["sign", "verify"]);
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(),
    subject: `CN=${dnsNames[0]}`,
    issuer: caCert.subject,
    notBefore: opts.notBefore ?? new Date(now - 60_000),
    notAfter: opts.notAfter ?? new Date(now + (opts.days ?? 365) * DAY),
    signingKey: caKey,
    publicKey: keys.publicKey,
    signingAlgorithm: ALG,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension(
        opts.clientAuth
          ? [x509.ExtendedKeyUsage.serverAuth, x509.ExtendedKeyUsage.clientAuth]
          : [x509.ExtendedKeyUsage.serverAuth],
      ),
      new x509.SubjectAlternativeNameExtension(
        dnsNames.map((value) => ({ type: isIPv4(value) ? ("ip" as const) : ("dns" as const), value })),
      ),
      await x509.AuthorityKeyIdentifierExtension.create(caCert),
    ],
  });
  return { certPem: cert.toString("pem"), keyPem: await exportKeyPem(keys.privateKey) };
}

export function describeCert(pem: string): CertInfo {
  const c = new X509Certificate(pem);
  return {
    subject: c.subject.replaceAll("\n", ", "),
    issuer: c.issuer.replaceAll("\n", ", "),
    dnsNames: (c.subjectAltName ?? "")
      .split(",")
      .map((s) => s.trim())
      .filter((s) => s.startsWith("DNS:"))
      .map((s) => s.slice(4)),
    ipAddresses: (c.subjectAltName ?? "")
      .split(",")
      .map((s) => s.trim())
      .filter((s) => s.startsWith("IP Address:"))
      .map((s) => s.slice("IP Address:".length)),
    notBefore: new Date(c.validFrom),
    notAfter: new Date(c.validTo),
    fingerprint256: c.fingerprint256,
    serialNumber: c.serialNumber,
  };
}

export const TLS_FILES = { cert: "tls.crt", key: "tls.key", ca: "ca.crt" } as const;

export interface PkiLayout {
  dir: string;
  caCertFile: string;
  caKeyFile: string;
}

export function pkiLayout(dir: string): PkiLayout {
  return { dir, caCertFile: join(dir, "ca.crt"), caKeyFile: join(dir, "ca.key") };
}

/**
 * Loads the stack CA, creating it when neither file exists. One file without the other is an
 * error, never overwritten: it may be the operator's own CA.
 */
export async function ensureCa(layout: PkiLayout): Promise<CaMaterial & { created: boolean }> {
  const [haveCert, haveKey] = [existsSync(layout.caCertFile), existsSync(layout.caKeyFile)];
  if (haveCert !== haveKey)
    throw new Error(
      haveCert
        ? `pki.caCertFile (${layout.caCertFile}) exists but pki.caKeyFile (${layout.caKeyFile}) does not: the stack issues certificates from the CA and needs its key; give both files, or neither to have a new CA generated`
        : `pki.caKeyFile (${layout.caKeyFile}) exists but pki.caCertFile (${layout.caCertFile}) does not: give both files, or neither to have a new CA generated`,
    );
  if (haveCert && haveKey) {
    const ca = {
      certPem: readFileSync(layout.caCertFile, "utf8"),
      keyPem: readFileSync(layout.caKeyFile, "utf8"),
    };
    const cert = new X509Certificate(ca.certPem);
    if (!cert.ca) throw new Error(`${layout.caCertFile} is not a CA certificate`);
    if (!cert.checkPrivateKey(createPrivateKey(ca.keyPem)))
      throw new Error(`${layout.caKeyFile} does not belong to ${layout.caCertFile}`);
    return { ...ca, created: false };
  }
  const ca = await createCa();
  writeFileAtomic(layout.caKeyFile, ca.keyPem, 0o600);
  writeFileAtomic(layout.caCertFile, ca.certPem, 0o644);
  return { ...ca, created: true };
}

export function sameNames(a: string[], b: string[]): boolean {
  return a.length === b.length && [...a].sort().join("\n") === [...b].sort().join("\n");
}

/**
 * Makes sure `folder` holds a certificate for exactly `dnsNames`, issued by this CA and valid for at
 * least `renewWithinDays` more days; issues a new one otherwise. Returns what it did.
 */
export async function ensureServerCert(
  folder: string,
  ca: CaMaterial,
  dnsNames: string[],
  opts: { renewWithinDays?: number; force?: boolean; clientAuth?: boolean } = {},
): Promise<"kept" | "issued"> {
  const certFile = join(folder, TLS_FILES.cert);
  const keyFile = join(folder, TLS_FILES.key);
  if (!opts.force && existsSync(certFile) && existsSync(keyFile)) {
    try {
      const pem = readFileSync(certFile, "utf8");
      const info = describeCert(pem);
      const issued = new X509Certificate(pem).checkIssued(new X509Certificate(ca.certPem));
      const fresh = info.notAfter.getTime() - Date.now() > (opts.renewWithinDays ?? 30) * DAY;
      const keyOk = new X509Certificate(pem).checkPrivateKey(createPrivateKey(readFileSync(keyFile, "utf8")));
      const usesOk = !opts.clientAuth || (new X509Certificate(pem).keyUsage ?? []).includes(CLIENT_AUTH_OID);
      if (issued && fresh && keyOk && usesOk && sameNames([...info.dnsNames, ...info.ipAddresses], dnsNames))
        return "kept";
    } catch {
      // unreadable or broken: issue a new one
    }
  }
  const { certPem, keyPem } = await issueServerCert(ca, dnsNames, { clientAuth: opts.clientAuth ?? false });
  writeFileAtomic(keyFile, keyPem, 0o600);
  writeFileAtomic(certFile, certPem, 0o644);
  writeFileAtomic(join(folder, TLS_FILES.ca), ca.certPem, 0o644);
  return "issued";
}

const CLIENT_AUTH_OID = "1.3.6.1.5.5.7.3.2";

export interface StackCertificate {
  name: string;
  folder: string;
  dnsNames: string[];
  /** Also for TLS clients (a NATS route presents it on the connections it opens). */
  clientAuth?: boolean;
}

/** The folder the NATS server's certificate lives in (tls.crt, tls.key, ca.crt). */
export function natsCertFolder(pkiDir: string): string {
  return join(pkiDir, "nats");
}

/** The folder the NATS cluster's route certificate lives in (every node presents it on its routes). */
export function natsRouteCertFolder(pkiDir: string): string {
  return join(pkiDir, "nats-route");
}

/** The folder an invocation replica's worker-listener certificate lives in. */
export function invocationCertFolder(pkiDir: string, podIp: string): string {
  return join(pkiDir, "invocation", podIp.replaceAll(".", "-"));
}

/** The folder a grpc-proxy replica's worker TLS listener certificate lives in. */
export function grpcProxyCertFolder(pkiDir: string, podIp: string): string {
  return join(pkiDir, "grpc-proxy", podIp.replaceAll(".", "-"));
}

/**
 * The certificates a stack needs from its CA: the proxy's frontend (unless the operator supplies
 * one), each invocation replica's worker listener (when the proxy re-encrypts to pods) and each
 * grpc-proxy replica's worker TLS listener (`<dashed-ip>.grpc-headless.<service domain>`, which
 * the proxy verifies when it routes a gRPC tunnel by its server name).
 */
export function stackCertificates(opts: {
  pkiDir: string;
  serviceDomain: string;
  workerDomain: string;
  proxyEnabled: boolean;
  upstreamTls: boolean;
  frontendCertFile: string;
  replicaIps: string[];
  /** The names and addresses clients reach nats-server at (its certificate covers each). */
  natsNames?: string[];
  /** nats.tls.certFile: issued here only when it is the stack's own default. */
  natsCertFile?: string;
  /** The addresses of a NATS cluster's routes (none without a cluster). */
  natsRouteNames?: string[];
  /** nats.cluster.tls.certFile: issued here only when it is the stack's own default. */
  natsRouteCertFile?: string;
  grpcReplicaIps?: string[];
}): StackCertificate[] {
  const out: StackCertificate[] = [];
  if (opts.natsNames?.length && opts.natsCertFile === join(natsCertFolder(opts.pkiDir), TLS_FILES.cert)) {
    out.push({ name: "nats-server", folder: natsCertFolder(opts.pkiDir), dnsNames: opts.natsNames });
  }
  if (
    opts.natsRouteNames?.length &&
    opts.natsRouteCertFile === join(natsRouteCertFolder(opts.pkiDir), TLS_FILES.cert)
  ) {
    out.push({
      name: "nats-server routes",
      folder: natsRouteCertFolder(opts.pkiDir),
      dnsNames: opts.natsRouteNames,
      clientAuth: true,
    });
  }
  if (!opts.proxyEnabled) return out;
  if (opts.frontendCertFile === join(opts.pkiDir, "proxy", TLS_FILES.cert)) {
    out.push({
      name: "callback proxy frontend",
      folder: join(opts.pkiDir, "proxy"),
      dnsNames: [`*.${opts.workerDomain}`, opts.workerDomain],
    });
  }
  if (opts.upstreamTls) {
    for (const ip of opts.replicaIps) {
      out.push({
        name: `invocation ${ip}`,
        folder: invocationCertFolder(opts.pkiDir, ip),
        dnsNames: [podHost(ip, "invocation", opts.serviceDomain)],
      });
    }
  }
  for (const ip of opts.grpcReplicaIps ?? []) {
    out.push({
      name: `grpc-proxy ${ip}`,
      folder: grpcProxyCertFolder(opts.pkiDir, ip),
      dnsNames: [podHost(ip, "grpc", opts.serviceDomain)],
    });
  }
  return out;
}
