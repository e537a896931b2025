// The webhook client: asks the API's webhook (the plugin of a token login) who the worker's token
// makes it, retrying transport errors and 5xx with backoff; a 4xx is a refusal.
import { setTimeout as sleep } from "node:timers/promises";
import { request } from "undici";
import type { SampledLog } from "./log-sampling.js";
import { Refusal } from "./refusal.js";

export interface WebhookPlugin {
  url: string;
  /** The callout's service token for the API. */
  serviceToken: string;
  timeoutMs?: number;
  retries?: number;
}

/** The webhook's answer: the user, its account, its permissions, an expiry. */
export interface WebhookAnswer {
  userId: string;
  account: string;
  expiresAt?: number;
  permissions: {
    publish: { allow: string[]; deny?: string[] };
    subscribe: { allow: string[]; deny?: string[] };
    response?: { maxMsgs: number };
  };
}

export async function askWebhook(
  p: WebhookPlugin,
  body: Record<string, string>,
  log: SampledLog,
): Promise<WebhookAnswer> {
  const retries = p.retries ?? 3;
  let last = "";
  for (let attempt = 0; attempt <= retries; attempt++) {
    if (attempt > 0) await sleep(100 * 2 ** (attempt - 1));
    log("debug", { url: p.url, account: body.account, attempt }, "webhook request");
    let res;
    try {
      res = await request(p.url, {
        method: "POST",
        headers: { authorization: `Bearer ${p.serviceToken}`, "content-type": "application/json" },
        body: JSON.stringify(body),
        headersTimeout: p.timeoutMs ?? 30_000,
        bodyTimeout: p.timeoutMs ?? 30_000,
      });
    } catch (err) {
      last = (err as Error).message;
      continue;
    }
    const text = await res.body.text();
    if (res.statusCode === 401 || res.statusCode === 403) {
      let detail = text.slice(0, 500);
      try {
        detail = (JSON.parse(text) as { detail?: string }).detail ?? detail;
      } catch {
        // not a problem document
      }
      throw new Refusal("denied", "Authentication denied", { status_code: res.statusCode, cause: detail });
    }
    if (res.statusCode >= 500) {
      last = `status ${res.statusCode}: ${text.slice(0, 200)}`;
      continue;
    }
    if (res.statusCode !== 200)
      throw new Refusal("denied", "Authentication denied", {
        status_code: res.statusCode,
        cause: text.slice(0, 500),
      });
    const a = JSON.parse(text) as Partial<WebhookAnswer>;
    if (typeof a.userId !== "string" || !a.userId || !a.permissions)
      throw new Refusal("failed", "Authentication failed", {
        cause: "the webhook answer carries no userId",
      });
    return a as WebhookAnswer;
  }
  throw new Refusal("failed", "Authentication failed", { cause: `webhook request failed: ${last}` });
}
