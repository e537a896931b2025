// What an operator is shown of a certificate (the console's health page): who it names, who signed
// it, and until when it is good. Read with node:crypto's X509Certificate from the PEM a listener
// serves with, or from a certificate file.
import { X509Certificate } from "node:crypto";

export interface CertificateInfo {
  /** Which certificate: the listener or file it is (e.g. "worker-tls", "stack-ca"). */
  name: string;
  subject: string;
  issuer: string;
  notBefore: string;
  /** ISO 8601. */
  notAfter: string;
}

/** X509Certificate's distinguished names are one attribute a line; one line reads better. */
const oneLine = (dn: string) => dn.split("\n").filter(Boolean).join(", ");

/** The first certificate of a PEM (a chain's leaf). Throws when it does not parse. */
export function describeCertificate(name: string, pem: string | Buffer): CertificateInfo {
  const c = new X509Certificate(pem);
  return {
    name,
    subject: oneLine(c.subject),
    issuer: oneLine(c.issuer),
    notBefore: new Date(c.validFrom).toISOString(),
    notAfter: new Date(c.validTo).toISOString(),
  };
}

/**
 * Describes the PEM a listener serves with, parsing again only when it changed (a reload): cheap
 * enough to ask at every registry refresh.
 */
export function certificateDescriber(name: string): (pem: string | undefined) => CertificateInfo[] {
  let last: { pem: string; info: CertificateInfo[] } | undefined;
  return (pem) => {
    if (!pem) return [];
    if (last?.pem !== pem) {
      let info: CertificateInfo[];
      try {
        info = [describeCertificate(name, pem)];
      } catch {
        info = [];
      }
      last = { pem, info };
    }
    return last.info;
  };
}
