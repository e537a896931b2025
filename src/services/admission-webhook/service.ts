// The admission webhook's HTTPS server: POST /validate takes an AdmissionReview (admission.k8s.io/v1)
// from the API server and answers it with review.ts's decision; /health and /metrics as every
// service. Its certificate is reloaded when the mounted Secret changes (cert-manager renews it), so
// a renewal never restarts the pods the cluster's pod admission depends on.
//
// A body that is not a review it can answer gets 400 ADMISSION_REVIEW_INVALID (or the shared codes:
// MALFORMED_JSON, UNSUPPORTED_MEDIA_TYPE, BODY_TOO_LARGE), never an "allowed": the registration's
// failure policy is Fail, so the API server refuses what it was reviewing.
import type { Server as HttpsServer } from "node:https";
import { CallplaneError } from "../../lib/errors.js";
import { Router, createHttpService, readJson, sendJson, type HttpService } from "../../lib/http/index.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import { Counter, createRegistry, type Registry } from "../../lib/metrics.js";
import type { HostPort } from "../../lib/net/index.js";
import { TlsReloader } from "../../lib/tls/index.js";
import { parseAdmissionReview } from "./review-request.js";
import { reviewAdmission, type ReviewPolicy } from "./review.js";

export const VALIDATE_PATH = "/validate";

/**
 * The largest review taken. The API server takes request bodies up to 3 MiB; the review of an
 * UPDATE carries the object twice (object and oldObject), with the server's defaults and
 * managedFields added, so twice that and some room. A larger review would be refused, and with it
 * the request it reviews (failure policy Fail).
 */
export const MAX_REVIEW_BYTES = 7 * 1024 * 1024;

export interface AdmissionWebhookOptions extends ReviewPolicy {
  listen: HostPort;
  tls: { certFile: string; keyFile: string };
  logger?: Logger;
  registry?: Registry;
}

export interface AdmissionWebhook {
  readonly http: HttpService;
  readonly registry: Registry;
  listen(): Promise<URL>;
  /** Drains (lib/http): answers for `delayMs` after /health failed, then finishes within `graceMs`. */
  close(graceMs?: number, delayMs?: number): Promise<void>;
  destroy(): void;
}

export function createAdmissionWebhook(opts: AdmissionWebhookOptions): AdmissionWebhook {
  const logger = opts.logger ?? silentLogger();
  const registry = opts.registry ?? createRegistry("admission-webhook");
  if (!opts.agentUsername)
    throw new Error(
      "the admission webhook needs the compute agent's username (admissionWebhook.agentUsername)",
    );
  if (!opts.tls.certFile || !opts.tls.keyFile)
    throw new Error(
      "the admission webhook serves HTTPS only (the API server calls webhooks over TLS): set admissionWebhook.tls.certFile and admissionWebhook.tls.keyFile",
    );
  const reviews = new Counter({
    name: "callplane_admission_reviews_total",
    help: "AdmissionReviews answered, by the kind reviewed (other: a kind not checked; unknown: an invalid review) and outcome (allowed, refused, invalid)",
    labelNames: ["kind", "outcome"],
    registers: [registry],
  });
  const policy: ReviewPolicy = { agentUsername: opts.agentUsername };
  // the reloader calls back only on a later change of the files, by when the server exists
  const tlsServer: { current?: HttpsServer } = {};
  const reloader = new TlsReloader(
    "admission-webhook",
    { certFile: opts.tls.certFile, keyFile: opts.tls.keyFile },
    (m) =>
      tlsServer.current?.setSecureContext({
        cert: m.cert,
        key: m.key,
        minVersion: "TLSv1.2",
      }),
    logger,
    registry,
  );
  const router = new Router().add("POST", VALIDATE_PATH, async ({ req, res, log }) => {
    let body: unknown;
    try {
      body = await readJson(req, MAX_REVIEW_BYTES);
      if (body === undefined)
        throw new CallplaneError(
          "ADMISSION_REVIEW_INVALID",
          "the body is empty: POST an AdmissionReview (admission.k8s.io/v1) as JSON",
        );
      const result = reviewAdmission(parseAdmissionReview(body), policy);
      reviews.inc({ kind: result.kind, outcome: result.outcome });
      const r = (body as { request: Record<string, unknown> }).request;
      const about = {
        uid: result.answer.response.uid,
        kind: result.kind,
        operation: r.operation,
        namespace: r.namespace,
        name: r.name,
        user: (r.userInfo as { username?: unknown } | undefined)?.username,
        reserved: result.reserved,
      };
      if (result.outcome === "refused")
        log.info(about, "admission refused: reserved worker account or Secret");
      else if (result.reserved.length)
        log.info(about, "admission allowed: reserved worker account or Secret");
      sendJson(res, 200, result.answer);
    } catch (err) {
      if (err instanceof CallplaneError) reviews.inc({ kind: "unknown", outcome: "invalid" });
      throw err;
    }
  });
  const http = createHttpService({
    name: "admission-webhook",
    listen: opts.listen,
    logger,
    registry,
    router,
    // the API server waits timeoutSeconds (at most 30) for an answer
    requestTimeoutMs: 30_000,
    tls: {
      cert: reloader.material.cert,
      key: reloader.material.key,
      minVersion: "TLSv1.2",
      ALPNProtocols: ["http/1.1"],
    },
  });
  tlsServer.current = http.server as HttpsServer;
  return {
    http,
    registry,
    listen: () => http.listen(),
    async close(graceMs = 10_000, delayMs = 0) {
      await http.close(graceMs, delayMs);
      reloader.close();
    },
    destroy() {
      http.destroy();
      reloader.close();
    },
  };
}
