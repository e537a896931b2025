// grpc-proxy's own metrics (the listeners, the auth cache and the TLS reloaders add theirs).
import { Counter, Gauge, type Registry } from "../../lib/metrics.js";

export interface GrpcProxyMetrics {
  calls: Counter<"outcome">;
  tunnels: Counter<"result">;
  openSessions: Gauge;
  waitingSessions: Gauge;
}

export function grpcProxyMetrics(registry: Registry): GrpcProxyMetrics {
  return {
    calls: new Counter({
      name: "callplane_grpc_calls_total",
      help: "Client gRPC calls by outcome (ok: passed through and answered; refused: answered by grpc-proxy itself; reset; failed: the tunnel failed)",
      labelNames: ["outcome"],
      registers: [registry],
    }),
    tunnels: new Counter({
      name: "callplane_grpc_tunnels_total",
      help: "Worker CONNECT requests by result",
      labelNames: ["result"],
      registers: [registry],
    }),
    openSessions: new Gauge({
      name: "callplane_grpc_sessions_open",
      help: "Worker sessions with a tunnel to this replica",
      registers: [registry],
    }),
    waitingSessions: new Gauge({
      name: "callplane_grpc_sessions_waiting",
      help: "Sessions waiting for their worker's tunnel",
      registers: [registry],
    }),
  };
}
