// What the console reads of the replicas' reports (ReplicaReports, ../replica-reports.ts): the
// three questions it asks, so that a test may hand a page another source. In the API the source is
// deps.trust.replicaReports(), undefined while NATS is not configured.
import type { ReplicaReports } from "../replica-reports.js";

export type {
  FunctionStats,
  InFlightRow,
  LogsReply,
  RegistryEntry,
  ReplicaReport,
  RequestLookup,
  VersionHour,
} from "../replica-reports.js";

export type ReplicaReportsView = Pick<ReplicaReports, "snapshot" | "lookup" | "registry" | "logs">;

/** Where the console gets the replicas' reports now (undefined: NATS is not configured). */
export type ReportsSource = () => ReplicaReportsView | undefined;
