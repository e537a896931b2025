// nats-server's configuration for the rendered StatefulSet: three JetStream servers in one cluster,
// TLS on every client connection and between the servers (mutual, from the stack CA), and the same
// accounts and auth callout as the local stack (src/lib/nats/permissions.ts). The accounts part names the
// services' public nkeys, which render never sees (it has no Secret values), so an init container
// writes it from the mounted keys at pod start: `callplane nats auth-config`, the same function the
// local stack uses. It lands in auth.conf beside this file, which includes it.
import type { ClusterNames } from "../cluster-config.js";
import { MOUNTS, NATS_CLUSTER_SIZE, NATS_PORTS, SERVICES } from "../layout.js";

export function natsServerConf(opts: { names: ClusterNames; maxPayload: number }): string {
  const { names } = opts;
  const routes = Array.from(
    { length: NATS_CLUSTER_SIZE },
    (_, i) => `    nats://nats-${i}.${names.fqdn(SERVICES.natsHeadless)}:${NATS_PORTS.cluster}`,
  );
  return [
    "# nats-server for callplane (rendered by `callplane render`): one of three JetStream servers.",
    "# server_name comes from the pod's name ($POD_NAME, from the Downward API).",
    "server_name: $POD_NAME",
    `listen: "0.0.0.0:${NATS_PORTS.client}"`,
    `http: "0.0.0.0:${NATS_PORTS.monitor}"`,
    `max_payload: ${opts.maxPayload}`,
    // the preStop hook finds the server by it to put it in lame duck mode
    `pid_file: "/var/run/nats/nats.pid"`,
    // a stopping server hands its clients to the others before it goes
    "lame_duck_duration: 30s",
    "lame_duck_grace_period: 10s",
    "jetstream {",
    `  store_dir: "${MOUNTS.natsData}/jetstream"`,
    "  max_memory_store: 256MB",
    "}",
    "tls {",
    `  cert_file: "${MOUNTS.natsTls}/tls.crt"`,
    `  key_file: "${MOUNTS.natsTls}/tls.key"`,
    "  timeout: 5",
    "}",
    "cluster {",
    "  name: callplane",
    `  listen: "0.0.0.0:${NATS_PORTS.cluster}"`,
    "  routes: [",
    ...routes,
    "  ]",
    "  # the servers prove themselves to each other with certificates from the stack CA",
    "  tls {",
    `    cert_file: "${MOUNTS.natsTls}/tls.crt"`,
    `    key_file: "${MOUNTS.natsTls}/tls.key"`,
    `    ca_file: "${MOUNTS.natsTls}/ca.crt"`,
    "    verify: true",
    "    timeout: 5",
    "  }",
    "}",
    "# accounts (APP, AUTH, SYS), the services' users and the auth callout: written at pod start",
    "include ../auth/auth.conf",
    "",
  ].join("\n");
}
