// The demo the stack sets up on first start: an echo function (the example inference server's
// /echo route), deployed with two instances, and an API key to invoke it. Its ids live in
// <data>/demo.json so that a second start reuses them instead of creating another function.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { request } from "undici";
import { createAdminTokenSigner, writeFileAtomic } from "../lib/auth.js";

export interface Demo {
  httpFunctionId: string;
  httpFunctionVersionId: string;
  httpFunctionName: string;
  apiKey: string;
}

async function api<T>(
  base: string,
  token: string,
  method: string,
  path: string,
  body?: unknown,
): Promise<{ status: number; body: T }> {
  const res = await request(new URL(path, base), {
    method: method as "GET",
    headers: {
      authorization: `Bearer ${token}`,
      ...(body !== undefined ? { "content-type": "application/json" } : {}),
    },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  });
  const text = await res.body.text();
  return { status: res.statusCode, body: (text ? JSON.parse(text) : undefined) as T };
}

export async function ensureDemo(opts: {
  apiUrl: string;
  dataDir: string;
  signingKeyFile: string;
  say: (s: string) => void;
}): Promise<Demo> {
  const signer = await createAdminTokenSigner(readFileSync(opts.signingKeyFile, "utf8"), 3600);
  const token = (await signer.sign({ subject: "callplane-stack" })).token;
  const file = join(opts.dataDir, "demo.json");
  if (existsSync(file)) {
    const demo = JSON.parse(readFileSync(file, "utf8")) as Demo;
    const fn = await api(
      opts.apiUrl,
      token,
      "GET",
      `/v2/nvcf/functions/${demo.httpFunctionId}/versions/${demo.httpFunctionVersionId}`,
    );
    if (fn.status === 200) {
      const dep = await api(
        opts.apiUrl,
        token,
        "GET",
        `/v2/nvcf/deployments/functions/${demo.httpFunctionId}/versions/${demo.httpFunctionVersionId}`,
      );
      if (dep.status === 404) await deploy(opts.apiUrl, token, demo);
      opts.say(`reusing the demo function ${demo.httpFunctionName} (${demo.httpFunctionId})`);
      return demo;
    }
    opts.say("the demo function recorded in demo.json is gone; creating it again");
  }
  let name = "demo-echo";
  let created = await api<{ function: { id: string; versionId: string } }>(
    opts.apiUrl,
    token,
    "POST",
    "/v2/nvcf/functions",
    {
      name,
      inferenceUrl: "/echo",
      inferencePort: 8000,
      containerImage: "local/echo",
      health: { protocol: "HTTP", uri: "/health", timeout: "PT10S", expectedStatusCode: 200 },
      description: "callplane demo: echoes the request body",
    },
  );
  if (created.status === 409) {
    name = `demo-echo-${Date.now().toString(36)}`;
    created = await api(opts.apiUrl, token, "POST", "/v2/nvcf/functions", {
      name,
      inferenceUrl: "/echo",
      containerImage: "local/echo",
      health: { uri: "/health" },
    });
  }
  if (created.status !== 200)
    throw new Error(`creating the demo function failed: ${JSON.stringify(created.body)}`);
  const key = await api<{ value: string }>(opts.apiUrl, token, "POST", "/v1/keys", {
    description: "callplane demo key",
    expires_at: new Date(Date.now() + 365 * 86_400_000).toISOString(),
  });
  if (key.status !== 200) throw new Error(`creating the demo API key failed: ${JSON.stringify(key.body)}`);
  const demo: Demo = {
    httpFunctionId: created.body.function.id,
    httpFunctionVersionId: created.body.function.versionId,
    httpFunctionName: name,
    apiKey: key.body.value,
  };
  await deploy(opts.apiUrl, token, demo);
  writeFileAtomic(file, `${JSON.stringify(demo, null, 2)}\n`, 0o600);
  opts.say(`created the demo function ${name} (${demo.httpFunctionId}) with two instances`);
  return demo;
}

async function deploy(apiUrl: string, token: string, demo: Demo): Promise<void> {
  const r = await api(
    apiUrl,
    token,
    "POST",
    `/v2/nvcf/deployments/functions/${demo.httpFunctionId}/versions/${demo.httpFunctionVersionId}`,
    {
      deploymentSpecifications: [
        {
          gpu: "local",
          instanceType: "local.cpu",
          minInstances: 2,
          maxInstances: 2,
          maxRequestConcurrency: 16,
        },
      ],
    },
  );
  if (r.status !== 200 && r.status !== 409)
    throw new Error(`deploying the demo function failed: ${JSON.stringify(r.body)}`);
}

/** Waits until the demo's deployment has an ACTIVE instance (created at `since` or later, when given). */
export async function waitActive(
  apiUrl: string,
  signingKeyFile: string,
  demo: Demo,
  timeoutMs: number,
  since?: Date,
): Promise<void> {
  const signer = await createAdminTokenSigner(readFileSync(signingKeyFile, "utf8"), 3600);
  const token = (await signer.sign({ subject: "callplane-stack" })).token;
  const deadline = Date.now() + timeoutMs;
  let last = "";
  while (Date.now() < deadline) {
    const dep = await api<{
      deployment: {
        functionStatus: string;
        instances: Array<{ instanceStatus: string; instanceCreatedAt: string; message?: string }>;
      };
    }>(
      apiUrl,
      token,
      "GET",
      `/v2/nvcf/deployments/functions/${demo.httpFunctionId}/versions/${demo.httpFunctionVersionId}`,
    );
    // Fix: functionStatus alone also counts ACTIVE rows that a stack killed without stopping left
    // in the database, for instances that no longer exist; then the demo was invoked before any
    // instance of this start was up.
    const fresh = (i: { instanceCreatedAt: string }) =>
      !since || Date.parse(i.instanceCreatedAt) >= since.getTime();
    if (
      dep.body?.deployment?.functionStatus === "ACTIVE" &&
      dep.body.deployment.instances.some((i) => i.instanceStatus === "ACTIVE" && fresh(i))
    )
      return;
    last = JSON.stringify(
      dep.body?.deployment?.instances?.map((i) => i.message ?? i.instanceStatus) ?? dep.body,
    );
    await sleep(250);
  }
  throw new Error(
    `the demo function did not become ACTIVE within ${timeoutMs / 1000} s (instances: ${last})`,
  );
}

/** Invokes the demo and returns the status and answer. */
export async function invokeDemo(
  invocationUrl: string,
  demo: Demo,
  payload: unknown,
): Promise<{ status: number; body: string; requestId: string }> {
  const res = await request(`${invocationUrl}/v2/nvcf/pexec/functions/${demo.httpFunctionId}`, {
    method: "POST",
    headers: { authorization: `Bearer ${demo.apiKey}`, "content-type": "application/json" },
    body: JSON.stringify(payload),
  });
  return {
    status: res.statusCode,
    body: await res.body.text(),
    requestId: String(res.headers["nvcf-reqid"] ?? ""),
  };
}
