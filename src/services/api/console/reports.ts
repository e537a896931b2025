// What the console reads of the replicas' reports (the contract's ReplicaReports, built in
// ../replica-reports.ts): only its shape, so that a page can be given another source in a test.
// In the API it is deps.trust.replicaReports(), undefined while NATS is not configured.
export interface InFlightRow {
  requestId: string;
  functionId: string;
  versionId: string;
  state: "queued" | "responding";
  ageMs: number;
  poll: boolean;
}
export interface FunctionStats {
  functionId: string;
  versionId: string;
  requests: number;
  errors: number;
  p50Ms: number | undefined;
  p99Ms: number | undefined;
  inFlight: number;
}
export interface ReplicaReport {
  kind: "invocation";
  holder: string;
  version: string;
  startedAt: string;
  inFlight: number;
  requests: InFlightRow[];
  functions: FunctionStats[];
}
export interface RequestLookup {
  requestId: string;
  holder: string;
  state: "queued" | "responding" | "answered" | "failed" | "unknown";
  functionId?: string;
  versionId?: string;
  ageMs?: number;
  status?: number;
  code?: string;
  detail?: string;
  durationMs?: number;
  endedAt?: string;
}
export interface RegistryEntry {
  kind: "invocation" | "grpc-proxy";
  holder: string;
  relayUrl: string;
  startedAt: string;
}

export interface ReplicaReportsView {
  snapshot(opts?: { limit?: number; functionId?: string; waitMs?: number }): Promise<ReplicaReport[]>;
  lookup(requestId: string): Promise<RequestLookup | undefined>;
  registry(): Promise<RegistryEntry[]>;
}

/** Where the console gets the replicas' reports now (undefined: NATS is not configured). */
export type ReportsSource = () => ReplicaReportsView | undefined;
