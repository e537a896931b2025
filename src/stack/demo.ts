// The demo the stack sets up on first start: four functions on the example inference servers, so
// that each kind of answer can be tried at once: demo-echo (its /echo route, two instances: a 200
// with the body back), demo-stream (/sse: server-sent events, one by one), demo-slow (/slow:
// answers after ?seconds=N, writing progress, so a short NVCF-POLL-SECONDS gets a 202 and the
// answer comes from polling) and demo-grpc (the example gRPC server, called through grpc-proxy),
// and an API key to invoke them. Their ids live in
// <data>/demo.json so that a second start reuses them instead of creating more functions.
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { request } from "undici";
import { create as createMessage, fromBinary, toBinary } from "@bufbuild/protobuf";
import { EchoMessageSchema } from "../gen/callplane/examples/echo_pb.js";
import { createAdminTokenSigner } from "../lib/identity/index.js";
import { writeFileAtomic } from "../lib/fs.js";
import { rawUnary } from "../lib/grpc/index.js";

export interface Demo {
  httpFunctionId: string;
  httpFunctionVersionId: string;
  httpFunctionName: string;
  sseFunctionId: string;
  sseFunctionVersionId: string;
  sseFunctionName: string;
  slowFunctionId: string;
  slowFunctionVersionId: string;
  slowFunctionName: string;
  grpcFunctionId: string;
  grpcFunctionVersionId: string;
  grpcFunctionName: string;
  apiKey: string;
  /** The demo key's id (recorded since the stack checks the key on reuse). */
  apiKeyId?: string;
}

type Kind = "http" | "sse" | "slow" | "grpc";

const FUNCTIONS: ReadonlyArray<{
  kind: Kind;
  name: string;
  inferenceUrl: string;
  instances: number;
  description: string;
  containerImage?: string;
  health?: Record<string, unknown>;
}> = [
  {
    kind: "http",
    name: "demo-echo",
    inferenceUrl: "/echo",
    instances: 2,
    description: "callplane demo: echoes the request body",
  },
  {
    kind: "sse",
    name: "demo-stream",
    inferenceUrl: "/sse",
    instances: 1,
    description: "callplane demo: server-sent events (?events=5&intervalMs=200)",
  },
  {
    kind: "slow",
    name: "demo-slow",
    inferenceUrl: "/slow",
    instances: 1,
    description: "callplane demo: answers after ?seconds=3, reporting progress meanwhile",
  },
  {
    kind: "grpc",
    name: "demo-grpc",
    inferenceUrl: "/grpc",
    instances: 1,
    description:
      "callplane demo: gRPC callplane.examples.Echo (Unary, ServerStream, ClientStream, Bidi) through grpc-proxy",
    containerImage: "local/grpc-echo",
    health: { protocol: "gRPC", uri: "/", timeout: "PT10S", expectedStatusCode: 200 },
  },
];

interface DemoFunction {
  id: string;
  versionId: string;
  name: string;
}

function get(demo: Partial<Demo>, kind: Kind): DemoFunction | undefined {
  const id = demo[`${kind}FunctionId`];
  const versionId = demo[`${kind}FunctionVersionId`];
  const name = demo[`${kind}FunctionName`];
  return id && versionId && name ? { id, versionId, name } : undefined;
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
  const recorded: Partial<Demo> = existsSync(file)
    ? (JSON.parse(readFileSync(file, "utf8")) as Partial<Demo>)
    : {};
  const demo: Partial<Demo> = {};
  const created: string[] = [];
  let lost = false;
  for (const f of FUNCTIONS) {
    const known = get(recorded, f.kind);
    let fn: DemoFunction | undefined;
    if (known) {
      const found = await api(
        opts.apiUrl,
        token,
        "GET",
        `/v2/nvcf/functions/${known.id}/versions/${known.versionId}`,
      );
      if (found.status === 200) {
        fn = known;
        const dep = await api(opts.apiUrl, token, "GET", deploymentPath(fn));
        if (dep.status === 404) await deploy(opts.apiUrl, token, fn, f.instances);
        opts.say(`reusing the demo function ${fn.name} (${fn.id})`);
      } else {
        // the store was reset under the data folder: the recorded key is gone with it
        lost = true;
        opts.say(`the demo function ${known.name} recorded in demo.json is gone; creating it again`);
      }
    }
    if (!fn) {
      fn = await create(opts.apiUrl, token, f);
      await deploy(opts.apiUrl, token, fn, f.instances);
      created.push(
        `${fn.name} (${fn.id}, ${f.instances === 1 ? "one instance" : `${f.instances} instances`})`,
      );
    }
    demo[`${f.kind}FunctionId`] = fn.id;
    demo[`${f.kind}FunctionVersionId`] = fn.versionId;
    demo[`${f.kind}FunctionName`] = fn.name;
  }
  demo.apiKey = lost ? undefined : recorded.apiKey;
  demo.apiKeyId = lost ? undefined : recorded.apiKeyId;
  if (demo.apiKey && demo.apiKeyId) {
    // a key revoked or expired since the last start would fail the demo on every start
    const k = await api<{ status?: unknown }>(opts.apiUrl, token, "GET", `/v1/keys/${demo.apiKeyId}`);
    const state = k.status === 200 ? String(k.body.status) : "unknown to the API";
    if (state !== "ACTIVE") {
      opts.say(`the demo API key is ${state.toLowerCase()}; issuing a new one`);
      demo.apiKey = undefined;
    }
  }
  if (!demo.apiKey) {
    const key = await api<{ id: string; value: string }>(opts.apiUrl, token, "POST", "/v1/keys", {
      description: "callplane demo key",
      expires_at: new Date(Date.now() + 365 * 86_400_000).toISOString(),
    });
    if (key.status !== 200) throw new Error(`creating the demo API key failed: ${JSON.stringify(key.body)}`);
    demo.apiKey = key.body.value;
    demo.apiKeyId = key.body.id;
  }
  const complete = demo as Demo;
  writeFileAtomic(file, `${JSON.stringify(complete, null, 2)}\n`, 0o600);
  if (created.length) opts.say(`created the demo functions ${created.join(", ")}`);
  return complete;
}

async function create(apiUrl: string, token: string, f: (typeof FUNCTIONS)[number]): Promise<DemoFunction> {
  const body = (name: string) => ({
    name,
    inferenceUrl: f.inferenceUrl,
    inferencePort: 8000,
    containerImage: f.containerImage ?? "local/echo",
    health: f.health ?? { protocol: "HTTP", uri: "/health", timeout: "PT10S", expectedStatusCode: 200 },
    description: f.description,
  });
  let name = f.name;
  let created = await api<{ function: { id: string; versionId: string } }>(
    apiUrl,
    token,
    "POST",
    "/v2/nvcf/functions",
    body(name),
  );
  if (created.status === 409) {
    // a function of that name that this stack did not record (made by hand, or demo.json lost)
    name = `${f.name}-${Date.now().toString(36)}`;
    created = await api(apiUrl, token, "POST", "/v2/nvcf/functions", body(name));
  }
  if (created.status !== 200)
    throw new Error(`creating the demo function ${name} failed: ${JSON.stringify(created.body)}`);
  return { id: created.body.function.id, versionId: created.body.function.versionId, name };
}

const deploymentPath = (fn: DemoFunction) =>
  `/v2/nvcf/deployments/functions/${fn.id}/versions/${fn.versionId}`;

async function deploy(apiUrl: string, token: string, fn: DemoFunction, instances: number): Promise<void> {
  const r = await api(apiUrl, token, "POST", deploymentPath(fn), {
    deploymentSpecifications: [
      {
        gpu: "local",
        instanceType: "local.cpu",
        minInstances: instances,
        maxInstances: instances,
        maxRequestConcurrency: 16,
      },
    ],
  });
  if (r.status !== 200 && r.status !== 409)
    throw new Error(`deploying the demo function ${fn.name} failed: ${JSON.stringify(r.body)}`);
}

/** Waits until each demo function has an ACTIVE instance (created at `since` or later, when given). */
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
  const waiting = new Map<Kind, DemoFunction>();
  for (const f of FUNCTIONS) {
    const fn = get(demo, f.kind);
    if (fn) waiting.set(f.kind, fn);
  }
  let last = "";
  while (Date.now() < deadline) {
    for (const [kind, fn] of waiting) {
      const dep = await api<{
        deployment: {
          functionStatus: string;
          instances: Array<{ instanceStatus: string; instanceCreatedAt: string; message?: string }>;
        };
      }>(apiUrl, token, "GET", deploymentPath(fn));
      // Fix: functionStatus alone also counts ACTIVE rows that a stack killed without stopping
      // left in the database, for instances that no longer exist; then the demo was invoked
      // before any instance of this start was up.
      const fresh = (i: { instanceCreatedAt: string }) =>
        !since || Date.parse(i.instanceCreatedAt) >= since.getTime();
      if (
        dep.body?.deployment?.functionStatus === "ACTIVE" &&
        dep.body.deployment.instances.some((i) => i.instanceStatus === "ACTIVE" && fresh(i))
      ) {
        waiting.delete(kind);
        continue;
      }
      last = `${fn.name}: ${JSON.stringify(
        dep.body?.deployment?.instances?.map((i) => i.message ?? i.instanceStatus) ?? dep.body,
      )}`;
    }
    if (waiting.size === 0) return;
    await sleep(250);
  }
  throw new Error(
    `the demo functions did not become ACTIVE within ${timeoutMs / 1000} s (instances of ${last})`,
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
    headers: {
      authorization: `Bearer ${demo.apiKey}`,
      "content-type": "application/json",
      // sampled: the stack records this trace whatever its sample ratio (npm start prints how to see it)
      traceparent: `00-${randomBytes(16).toString("hex")}-${randomBytes(8).toString("hex")}-01`,
    },
    body: JSON.stringify(payload),
  });
  return {
    status: res.statusCode,
    body: await res.body.text(),
    requestId: String(res.headers["nvcf-reqid"] ?? ""),
  };
}

/**
 * Warms the invocation path: `perReplica` invocations of demo-echo (1 KiB bodies, `concurrency` at
 * a time) through each replica, so its first users meet optimized code. A cold stack spends 3-4
 * times the CPU per invocation for its first ten thousand or so (V8 compiling the hot path as it
 * runs: measured 3.6 ms of CPU per invocation in the first 2 s under load, 0.86 ms after 10 s).
 */
export async function warmDemo(
  invocationUrls: readonly string[],
  demo: Demo,
  o: { perReplica: number; concurrency: number },
): Promise<{ invocations: number; failed: number; ms: number }> {
  const started = Date.now();
  const body = JSON.stringify({ warm: "x".repeat(1000) });
  let failed = 0;
  await Promise.all(
    invocationUrls.map(async (base) => {
      const url = `${base}/v2/nvcf/pexec/functions/${demo.httpFunctionId}`;
      let left = o.perReplica;
      await Promise.all(
        Array.from({ length: o.concurrency }, async () => {
          while (left-- > 0) {
            const res = await request(url, {
              method: "POST",
              headers: { authorization: `Bearer ${demo.apiKey}`, "content-type": "application/json" },
              body,
            });
            await res.body.dump();
            if (res.statusCode !== 200) failed++;
          }
        }),
      );
    }),
  );
  return { invocations: invocationUrls.length * o.perReplica, failed, ms: Date.now() - started };
}

/** Calls demo-grpc's callplane.examples.Echo/Unary through grpc-proxy; resolves with the payload back. */
export async function invokeDemoGrpc(
  grpcUrl: string,
  demo: Demo,
  payload: string,
): Promise<{ payload: string; requestId: string }> {
  const r = await rawUnary(
    new URL(grpcUrl).host,
    "/callplane.examples.Echo/Unary",
    toBinary(EchoMessageSchema, createMessage(EchoMessageSchema, { payload: Buffer.from(payload) })),
    { authorization: `Bearer ${demo.apiKey}`, "function-id": demo.grpcFunctionId },
    60_000,
  ).catch((err: Error & { details?: string }) => {
    throw new Error(`the demo gRPC call failed: ${err.details ?? err.message}`);
  });
  return {
    payload: Buffer.from(fromBinary(EchoMessageSchema, r.response).payload).toString(),
    requestId: String(r.headers.get("nvcf-reqid")[0] ?? ""),
  };
}
