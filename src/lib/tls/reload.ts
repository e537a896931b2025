// Certificates and CA bundles that reload when their files change, without a restart and without
// breaking connections in flight (callers swap a new secure context in; live sessions keep theirs).
// The folder is watched, not the files: Kubernetes updates a mounted Secret by swapping a `..data`
// symlink, which a watch on the file path never sees. A poll backs the watch up. A bad update (a key
// that does not match, an expired or unparsable certificate) keeps the last good material and says
// so in the log and in callplane_tls_reloads_total{result="rejected"}.
import { X509Certificate, createHash, createPrivateKey } from "node:crypto";
import { createSecureContext } from "node:tls";
import { watch, readFileSync, type FSWatcher } from "node:fs";
import { dirname } from "node:path";
import type { Logger } from "../log.js";
import { Counter, Gauge, type Registry } from "../metrics.js";

export interface TlsMaterial {
  cert?: string;
  key?: string;
  ca?: string;
}

export interface TlsFiles {
  certFile?: string | undefined;
  keyFile?: string | undefined;
  caFile?: string | undefined;
}

function check(m: TlsMaterial, now = Date.now()): void {
  if (m.cert) {
    const c = new X509Certificate(m.cert);
    if (Date.parse(c.validTo) <= now) throw new Error(`the certificate expired at ${c.validTo}`);
    if (Date.parse(c.validFrom) > now + 5 * 60_000)
      throw new Error(`the certificate is not valid before ${c.validFrom}`);
    if (m.key && !c.checkPrivateKey(createPrivateKey(m.key)))
      throw new Error("the key does not belong to the certificate");
  }
  if (m.ca) {
    // every certificate in the bundle must parse
    const blocks = m.ca.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? [];
    if (blocks.length === 0) throw new Error("the CA bundle holds no certificate");
    for (const b of blocks) new X509Certificate(b);
  }
  // what the TLS layer itself would refuse
  createSecureContext({
    ...(m.cert ? { cert: m.cert } : {}),
    ...(m.key ? { key: m.key } : {}),
    ...(m.ca ? { ca: m.ca } : {}),
  });
}

function loadTlsFiles(files: TlsFiles): TlsMaterial {
  const m: TlsMaterial = {};
  if (files.certFile) m.cert = readFileSync(files.certFile, "utf8");
  if (files.keyFile) m.key = readFileSync(files.keyFile, "utf8");
  if (files.caFile) m.ca = readFileSync(files.caFile, "utf8");
  check(m);
  return m;
}

export class TlsReloader {
  private current: TlsMaterial;
  private digest: string;
  private readonly watchers: FSWatcher[] = [];
  private poll: NodeJS.Timeout | undefined;
  private debounce: NodeJS.Timeout | undefined;
  private burstStarted: number | undefined;
  private readonly reloads: Counter;
  private readonly notAfter: Gauge;

  constructor(
    private readonly name: string,
    private readonly files: TlsFiles,
    /** Applies new material; a promise when it takes effect elsewhere (counted once it settles). */
    private readonly onChange: (m: TlsMaterial) => void | Promise<void>,
    private readonly logger: Logger,
    registry: Registry,
    opts: { pollMs?: number } = {},
  ) {
    this.current = loadTlsFiles(files);
    this.digest = this.hash(this.current);
    this.reloads =
      (registry.getSingleMetric("callplane_tls_reloads_total") as Counter | undefined) ??
      new Counter({
        name: "callplane_tls_reloads_total",
        help: "Certificate reloads by material and result (applied, rejected)",
        labelNames: ["material", "result"],
        registers: [registry],
      });
    this.notAfter =
      (registry.getSingleMetric("callplane_tls_cert_not_after_seconds") as Gauge | undefined) ??
      new Gauge({
        name: "callplane_tls_cert_not_after_seconds",
        help: "Expiry of the certificate in use (Unix time)",
        labelNames: ["material"],
        registers: [registry],
      });
    this.setExpiry();
    const dirs = new Set(
      [files.certFile, files.keyFile, files.caFile].filter((f): f is string => !!f).map((f) => dirname(f)),
    );
    for (const d of dirs) {
      try {
        const w = watch(d, { persistent: false }, () => this.schedule());
        w.on("error", () => undefined);
        this.watchers.push(w);
      } catch (err) {
        logger.warn(
          { material: name, dir: d, err: (err as Error).message },
          "cannot watch the certificate folder; relying on polling",
        );
      }
    }
    this.poll = setInterval(() => this.reload(), opts.pollMs ?? 30_000);
    this.poll.unref();
  }

  get material(): TlsMaterial {
    return this.current;
  }

  private hash(m: TlsMaterial): string {
    return createHash("sha256")
      .update(m.cert ?? "")
      .update("\0")
      .update(m.key ?? "")
      .update("\0")
      .update(m.ca ?? "")
      .digest("hex");
  }

  private setExpiry(): void {
    if (this.current.cert)
      this.notAfter.set(
        { material: this.name },
        Date.parse(new X509Certificate(this.current.cert).validTo) / 1000,
      );
  }

  private schedule(): void {
    // Writers replace several files in a row: wait for them to settle (100 ms without an event).
    // But the folder may never settle (a log or lock file beside the certificate changes all the
    // time, and every change wakes the watch), so a burst waits at most 1 s from its first event.
    const now = Date.now();
    this.burstStarted ??= now;
    if (this.debounce) clearTimeout(this.debounce);
    this.debounce = setTimeout(
      () => {
        this.debounce = undefined;
        this.burstStarted = undefined;
        this.reload();
      },
      Math.max(0, Math.min(100, this.burstStarted + 1000 - now)),
    );
  }

  /** Re-reads the files; applies them if they changed and are good. */
  reload(): void {
    let next: TlsMaterial;
    try {
      next = {};
      if (this.files.certFile) next.cert = readFileSync(this.files.certFile, "utf8");
      if (this.files.keyFile) next.key = readFileSync(this.files.keyFile, "utf8");
      if (this.files.caFile) next.ca = readFileSync(this.files.caFile, "utf8");
    } catch (err) {
      this.reloads.inc({ material: this.name, result: "rejected" });
      this.logger.error(
        { material: this.name, err: (err as Error).message },
        "cannot read the new certificate files; keeping the last good ones",
      );
      return;
    }
    const digest = this.hash(next);
    if (digest === this.digest) return;
    try {
      check(next);
    } catch (err) {
      this.digest = digest; // do not complain again until the files change again
      this.reloads.inc({ material: this.name, result: "rejected" });
      this.logger.error(
        { material: this.name, err: (err as Error).message },
        "rejected a certificate update; keeping the last good one",
      );
      return;
    }
    const previous = { material: this.current, digest: this.digest };
    this.current = next;
    this.digest = digest;
    this.setExpiry();
    const applied = () => {
      this.reloads.inc({ material: this.name, result: "applied" });
      this.logger.info(
        { material: this.name, notAfter: next.cert ? new X509Certificate(next.cert).validTo : undefined },
        "certificate reloaded",
      );
    };
    // A change applied elsewhere (HAProxy's runtime API) counts once it has taken effect; one that
    // failed there leaves the last good material in place, and the next poll tries again.
    const pending = this.onChange(next);
    if (!pending) return applied();
    pending.then(applied, (err: unknown) => {
      if (this.digest === digest) {
        this.current = previous.material;
        this.digest = previous.digest;
        this.setExpiry();
      }
      this.reloads.inc({ material: this.name, result: "rejected" });
      this.logger.error(
        { material: this.name, err: (err as Error).message },
        "the certificate update was not applied; keeping the last good one (tried again at the next poll)",
      );
    });
  }

  close(): void {
    for (const w of this.watchers) w.close();
    if (this.poll) clearInterval(this.poll);
    if (this.debounce) clearTimeout(this.debounce);
  }
}
