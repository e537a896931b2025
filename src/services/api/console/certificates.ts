// The health page's certificates: the ones the plane serves with, each with its subject, issuer,
// expiry and days left, in a warning state under WARN_DAYS. The replicas' (invocation, grpc-proxy)
// come from their registry entries, which name the certificates their TLS listeners serve with now
// (plane/registry.ts; grpc-proxy has no other report, and one place serves both kinds); the stack
// CA's and the other files the API was given it reads itself, at each view (a few small files).
import { readFile } from "node:fs/promises";
import { describeCertificate, type CertificateInfo } from "../../../lib/tls/index.js";
import type { ConsoleDeps } from "./context.js";
import { html, type Html } from "./html.js";

/** Under this many days left a certificate is shown as a warning. */
export const WARN_DAYS = 14;
const DAY_MS = 86_400_000;

type CertState = "ok" | "warning" | "expired" | "unknown";

interface CertRow {
  /** Whose: "api" (a file it reads) or the replica's kind. */
  component: string;
  /** The replica's holder id, or the file. */
  where: string;
  cert?: CertificateInfo;
  state: CertState;
  daysLeft?: number;
  detail?: string;
}

function rowOf(component: string, where: string, cert: CertificateInfo, now: number): CertRow {
  const left = (Date.parse(cert.notAfter) - now) / DAY_MS;
  const state: CertState = left <= 0 ? "expired" : left < WARN_DAYS ? "warning" : "ok";
  return { component, where, cert, state, daysLeft: Math.floor(left) };
}

async function fileRows(c: ConsoleDeps, now: number): Promise<CertRow[]> {
  const rows = await Promise.all(
    c.certificateFiles.map(async ({ name, file }): Promise<CertRow | undefined> => {
      let pem: Buffer;
      try {
        pem = await readFile(file);
      } catch (err) {
        // not on this machine (a cluster mounts it elsewhere): nothing to show, not an alarm
        if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
        return {
          component: "api",
          where: file,
          state: "unknown",
          detail: `unreadable: ${(err as Error).message}`,
        };
      }
      try {
        return rowOf("api", file, describeCertificate(name, pem), now);
      } catch (err) {
        return {
          component: "api",
          where: file,
          state: "unknown",
          detail: `${name}: not a certificate (${(err as Error).message})`,
        };
      }
    }),
  );
  return rows.filter((r): r is CertRow => r !== undefined);
}

async function replicaRows(c: ConsoleDeps, now: number): Promise<CertRow[]> {
  const reports = c.reports();
  if (!reports) return [];
  try {
    const entries = await reports.registry();
    return entries.flatMap((e) => e.certificates.map((cert) => rowOf(e.kind, e.holder, cert, now)));
  } catch {
    return [];
  }
}

export async function certificateRows(c: ConsoleDeps, now = Date.now()): Promise<CertRow[]> {
  const [files, replicas] = await Promise.all([fileRows(c, now), replicaRows(c, now)]);
  return [...files, ...replicas];
}

export function certificatesBody(rows: CertRow[]): Html {
  return html`<h2 id="certificates-heading">Certificates</h2>
    <div class="table-wrap">
      <table id="certificates" aria-labelledby="certificates-heading">
        <thead>
          <tr>
            <th scope="col">Certificate</th>
            <th scope="col">State</th>
            <th scope="col">Served by</th>
            <th scope="col">Subject</th>
            <th scope="col">Issuer</th>
            <th scope="col">Not after</th>
            <th scope="col" class="num">Days left</th>
          </tr>
        </thead>
        <tbody>
          ${rows.map(
            (r) =>
              html`<tr
                data-certificate="${r.cert?.name ?? ""}"
                data-served-by="${r.component}"
                data-state="${r.state}"
                ${r.daysLeft !== undefined ? html` data-days-left="${r.daysLeft}"` : ""}
              >
                <th scope="row">${r.cert?.name ?? ""}</th>
                <td class="state">${r.state}</td>
                <td>${r.component}<br /><span class="id">${r.where}</span></td>
                <td>${r.cert?.subject ?? r.detail ?? ""}</td>
                <td>${r.cert?.issuer ?? ""}</td>
                <td>${r.cert?.notAfter ?? ""}</td>
                <td class="num">${r.daysLeft ?? ""}</td>
              </tr> `,
          )}
        </tbody>
      </table>
    </div>
    <p class="muted">
      ${rows.length === 0 ? html`<span id="certificates-none">No certificate could be read from here.</span> ` : ""}
      Warning: under ${WARN_DAYS} days left. Replicas name the certificates they serve with in their registry
      entries (every replica registers, relay on or off); the API itself serves plain HTTP (TLS, where used,
      ends in front of it), and reads the stack CA and the other certificate files it is configured with when
      they are on its machine.
    </p>`;
}
