// 50-gateway.yaml: the edge, with the Gateway API: one Gateway and a route per front door (the API,
// invocation, the admin issuer, gRPC and its worker tunnels, the callback proxy by TLS passthrough,
// NATS), each only when its part is on.
import { Gateway, HTTPRoute } from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1";
import { TCPRoute, TLSRoute } from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1alpha2";
import { GATEWAY, NATS_PORTS, SERVICES, WORKLOADS } from "../layout.js";
import type { RenderContext } from "./context.js";
import type { K8sObject } from "./types.js";

export function renderGateway(k: RenderContext): K8sObject[] {
  const g = k.c.ingress.gatewayApi;
  const c = k.c;
  const ports = k.plan.ports;
  const listeners: NonNullable<Gateway["spec"]>["listeners"] = [
    {
      name: "http",
      protocol: "HTTP",
      port: 80,
      hostname: `*.${g.domain}`,
      allowedRoutes: { namespaces: { from: "Same" } },
    },
    {
      name: "https",
      protocol: "HTTPS",
      port: 443,
      hostname: `*.${g.domain}`,
      tls: { mode: "Terminate", certificateRefs: [{ kind: "Secret", name: g.tls.secretName }] },
      allowedRoutes: { namespaces: { from: "Same" } },
    },
  ];
  k.secrets.use(
    g.tls.secretName,
    ["tls.crt", "tls.key"],
    `Gateway ${GATEWAY}`,
    `the edge's certificate for *.${g.domain} (ingress.gatewayApi.tls.secretName)`,
  );
  const routes: K8sObject[] = [];
  const parent = (sectionName: string) => [{ name: GATEWAY, sectionName }];
  routes.push(
    new HTTPRoute({
      metadata: k.meta("https-redirect"),
      spec: {
        parentRefs: parent("http"),
        rules: [
          { filters: [{ type: "RequestRedirect", requestRedirect: { scheme: "https", statusCode: 301 } }] },
        ],
      },
    }),
    new HTTPRoute({
      metadata: k.meta("nvcf-api", WORKLOADS.api),
      spec: {
        parentRefs: parent("https"),
        hostnames: [`api.${g.domain}`],
        rules: [{ backendRefs: [{ name: SERVICES.api, port: ports.api }] }],
      },
    }),
    new HTTPRoute({
      metadata: k.meta("invocation", WORKLOADS.invocation),
      spec: {
        parentRefs: parent("https"),
        hostnames: [`invocation.${g.domain}`],
        rules: [
          {
            backendRefs: [{ name: SERVICES.invocation, port: ports.invocation }],
            // no edge timeout: the replica bounds each invocation by its poll window, and an
            // answer (server-sent events, a large body) may stream for longer than any fixed limit
            timeouts: { request: "0s" },
          },
        ],
      },
    }),
  );
  if (c.adminIssuerProxy.enabled && c.adminIssuerProxy.gateway.enabled)
    routes.push(
      new HTTPRoute({
        metadata: k.meta("admin-token-issuer-proxy", WORKLOADS.issuer),
        spec: {
          parentRefs: parent("https"),
          hostnames: [`api-keys.${g.domain}`],
          rules: [
            {
              matches: [{ path: { type: "Exact", value: "/v1/admin/keys" }, method: "POST" }],
              backendRefs: [{ name: SERVICES.issuer, port: ports.issuer }],
            },
          ],
        },
      }),
    );
  if (k.grpcOn) {
    listeners.push({
      name: "grpc",
      protocol: "TCP",
      port: ports.grpc,
      allowedRoutes: { namespaces: { from: "Same" } },
    });
    routes.push(
      new TCPRoute({
        metadata: k.meta("grpc-proxy", WORKLOADS.grpc),
        spec: {
          parentRefs: parent("grpc"),
          rules: [{ backendRefs: [{ name: SERVICES.grpc, port: ports.grpc }] }],
        },
      }),
    );
    if (g.routes.grpcWorker.enabled) {
      listeners.push({
        name: g.routes.grpcWorker.listenerName,
        protocol: "TCP",
        port: ports.grpcConnect,
        allowedRoutes: { namespaces: { from: "Same" } },
      });
      routes.push(
        new TCPRoute({
          metadata: k.meta("grpc-worker", WORKLOADS.grpc),
          spec: {
            parentRefs: parent(g.routes.grpcWorker.listenerName),
            rules: [{ backendRefs: [{ name: SERVICES.grpc, port: ports.grpcConnect }] }],
          },
        }),
      );
    }
  }
  if (k.proxyOn) {
    const wd = c.workerCallbackProxy.workerDomain;
    // passthrough: the proxy's own TLS frontend tells HTTP callbacks from gRPC tunnels by the name
    listeners.push({
      name: "worker-tls",
      protocol: "TLS",
      port: ports.proxy,
      hostname: `*.${wd}`,
      tls: { mode: "Passthrough" },
      allowedRoutes: { namespaces: { from: "Same" } },
    });
    routes.push(
      new TLSRoute({
        metadata: k.meta("worker-callback-proxy", WORKLOADS.proxy),
        spec: {
          parentRefs: parent("worker-tls"),
          hostnames: [`*.${wd}`],
          rules: [{ backendRefs: [{ name: SERVICES.proxy, port: ports.proxy }] }],
        },
      }),
    );
  }
  if (c.nats.server.enabled && g.routes.nats.enabled) {
    listeners.push({
      name: "nats",
      protocol: "TCP",
      port: NATS_PORTS.client,
      allowedRoutes: { namespaces: { from: "Same" } },
    });
    routes.push(
      new TCPRoute({
        metadata: k.meta("nats", WORKLOADS.nats),
        spec: {
          parentRefs: parent("nats"),
          rules: [{ backendRefs: [{ name: SERVICES.nats, port: NATS_PORTS.client }] }],
        },
      }),
    );
  }
  return [
    new Gateway({
      metadata: k.meta(GATEWAY),
      spec: { gatewayClassName: g.gatewayClassName, listeners },
    }),
    ...routes,
  ];
}
