// 60-network-policies.yaml: what the workers' pods may reach (and that nothing may reach them), and
// who may reach the admin issuer.
import { isIP } from "node:net";
import { NetworkPolicy, type INetworkPolicyPeer } from "kubernetes-models/networking.k8s.io/v1";
import { natsServerAddresses } from "../../lib/nats/cluster.js";
import { NATS_PORTS, SERVICES, WORKLOADS, type Workload } from "../layout.js";
import type { RenderContext } from "./context.js";
import type { K8sObject } from "./types.js";

type EgressRule = NonNullable<NonNullable<NetworkPolicy["spec"]>["egress"]>[number];

/**
 * The workers' rules to NATS, from the URL they dial (compute.kubernetes.workerNatsUrl, else
 * nats.url): the rendered StatefulSet's pods when a server is its Service (by any of the Service's
 * names), else that server's port, to any address (a NetworkPolicy cannot name a DNS name, and an
 * external server's address is not the cluster's to know), or to its address when the URL names an
 * IP literal.
 */
export function workerNatsEgress(k: RenderContext, toNats: INetworkPolicyPeer): EgressRule[] {
  const c = k.c;
  const svc = SERVICES.nats;
  const rendered = new Set([svc, `${svc}.${k.ns}`, `${svc}.${k.ns}.svc`, k.plan.names.fqdn(svc)]);
  const url =
    c.compute.kubernetes.workerNatsUrl ||
    (c.nats.server.enabled ? `tls://${k.plan.names.fqdn(svc)}:${NATS_PORTS.client}` : c.nats.url);
  const tcp = (port: number) => ({ protocol: "TCP" as const, port });
  const out: EgressRule[] = [];
  const key = (r: EgressRule) => JSON.stringify(r);
  const add = (r: EgressRule) => {
    if (!out.some((x) => key(x) === key(r))) out.push(r);
  };
  for (const { host, port } of natsServerAddresses(url)) {
    const h = host.toLowerCase().replace(/\.$/, "");
    if (c.nats.server.enabled && rendered.has(h)) add({ to: [toNats], ports: [tcp(NATS_PORTS.client)] });
    else if (isIP(h))
      add({ to: [{ ipBlock: { cidr: `${h}/${isIP(h) === 4 ? 32 : 128}` } }], ports: [tcp(port)] });
    else add({ ports: [tcp(port)] });
  }
  return out;
}

/**
 * Workers may reach the proxy and NATS, and nothing else (DNS aside). Without the proxy,
 * in-cluster workers call the pods back directly, so those ports are open to them instead.
 *
 * Both worker policies select every pod of the workers' namespace (`podSelector: {}`): the worker
 * pods the compute agent makes (app.kubernetes.io/managed-by: callplane-compute) and anything
 * else someone puts there, which is held to the same rules rather than left open.
 */
export function renderNetworkPolicies(k: RenderContext): K8sObject[] {
  const inNs = (w: Workload): INetworkPolicyPeer => ({
    namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": k.ns } },
    podSelector: { matchLabels: k.selector(w) },
  });
  const tcp = (port: number) => ({ protocol: "TCP" as const, port });
  const egress: NonNullable<NetworkPolicy["spec"]>["egress"] = [
    {
      to: [
        {
          namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "kube-system" } },
          podSelector: { matchLabels: { "k8s-app": "kube-dns" } },
        },
      ],
      ports: [
        { protocol: "UDP", port: 53 },
        { protocol: "TCP", port: 53 },
      ],
    },
  ];
  egress.push(...workerNatsEgress(k, inNs(WORKLOADS.nats)));
  if (k.proxyOn) {
    egress.push({ to: [inNs(WORKLOADS.proxy)], ports: [tcp(k.plan.ports.proxy)] });
  } else {
    egress.push({ to: [inNs(WORKLOADS.invocation)], ports: [tcp(k.plan.ports.invocation)] });
    if (k.grpcOn) egress.push({ to: [inNs(WORKLOADS.grpc)], ports: [tcp(k.plan.ports.grpcConnect)] });
  }
  const out: K8sObject[] = [
    new NetworkPolicy({
      metadata: k.meta("callplane-workers-egress", undefined, k.workerNs),
      spec: { podSelector: {}, policyTypes: ["Egress"], egress },
    }),
    // Nothing needs to reach a worker pod: the worker pulls its work from NATS and calls back out,
    // and the worker reaches its inference server inside the pod (a pod is never cut off from
    // itself). The kubelet's probes come from the pod's own node, which a NetworkPolicy always
    // lets through. So no ingress at all: another tenant's pod cannot call a function's server or
    // its worker's health port directly, around the plane's keys.
    new NetworkPolicy({
      metadata: k.meta("callplane-workers-ingress", undefined, k.workerNs),
      spec: { podSelector: {}, policyTypes: ["Ingress"], ingress: [] },
    }),
  ];
  const c = k.c;
  if (c.adminIssuerProxy.enabled) {
    // The issuer hands an admin token to whoever reaches it. Nothing in the control plane's or
    // the workers' namespace may (function instances run in the compute agent's pod); with its
    // route on, the Gateway's proxies (in their own namespace) may. kubectl port-forward still
    // reaches it: that goes through the kubelet, not the pod network.
    const w = WORKLOADS.issuer;
    const routed = c.ingress.gatewayApi.enabled && c.adminIssuerProxy.gateway.enabled;
    out.push(
      new NetworkPolicy({
        metadata: k.meta(`${w.name}-ingress`, w),
        spec: {
          podSelector: { matchLabels: k.selector(w) },
          policyTypes: ["Ingress"],
          ingress: routed
            ? [
                {
                  from: [
                    {
                      namespaceSelector: {
                        matchExpressions: [
                          {
                            key: "kubernetes.io/metadata.name",
                            operator: "NotIn",
                            values: [k.ns, k.workerNs],
                          },
                        ],
                      },
                    },
                  ],
                  ports: [tcp(k.plan.ports.issuer)],
                },
              ]
            : [],
        },
      }),
    );
  }
  return out;
}
