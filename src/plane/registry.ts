// The registry of live invocation replicas: a NATS KV bucket in which every replica keeps an entry
// under its holder id (the id its request ids carry) with the address other replicas reach it at.
// Entries expire unless refreshed, so a replica that dies drops out within the TTL. A replica that
// receives a callback for a request it does not hold looks the holder up here: the address always
// comes from the registry, never from the callback itself, so a relay can reach only live replicas.
// Only invocation replicas may write the bucket (their NATS grant; nobody else's covers it), so an
// address in it was written by a replica. An entry also names the certificates the replica serves
// with (subject, issuer, expiry: the operator console's health page shows them), so a rotated one
// shows within a refresh.
import { Kvm, type KV } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { holderHex } from "../lib/ids.js";
import type { CertificateInfo } from "../lib/tls/index.js";
import type { Logger } from "../lib/log.js";
import { REGISTRY_BUCKETS } from "../lib/nats/index.js";

export interface ReplicaEntry {
  holder: string;
  /** Where other replicas relay to: the invocation replica's plain listener, grpc-proxy's CONNECT listener. */
  relayUrl: string;
  startedAt: string;
  /** The certificates its TLS listeners serve with now (none without TLS). */
  certificates?: CertificateInfo[];
}

/** One registry per kind of replica: the invocation service's, grpc-proxy's (see lib/nats/permissions.ts). */
export class ReplicaRegistry {
  private kv: KV | undefined;
  private timer: NodeJS.Timeout | undefined;
  private readonly key: string;
  /** When this replica joined: each refresh keeps it (the operator console shows it). */
  private readonly startedAt = new Date().toISOString();
  /** A refresh is under way (one that remakes the bucket can outlast the interval). */
  private refreshing = false;

  constructor(
    private readonly nc: NatsConnection,
    private readonly self: {
      holder: number;
      relayUrl: string;
      /** The certificates served now, asked at each refresh. */
      certificates?: () => CertificateInfo[];
    },
    private readonly logger: Logger,
    private readonly ttlMs = 15_000,
    private readonly bucket: string = REGISTRY_BUCKETS.invocation,
    /** The bucket's replicas (nats.stream.replicas): on a cluster, a registry that survives a node. */
    private readonly replicas = 1,
  ) {
    this.key = holderHex(self.holder);
  }

  private entry(): string {
    return JSON.stringify({
      holder: this.key,
      relayUrl: this.self.relayUrl,
      startedAt: this.startedAt,
      certificates: this.self.certificates?.() ?? [],
    } satisfies ReplicaEntry);
  }

  async start(): Promise<void> {
    await this.open();
    await this.kv!.put(this.key, this.entry());
    // refresh well within the TTL, so one late refresh does not drop a live replica
    this.timer = setInterval(() => void this.refresh(), Math.max(250, Math.floor(this.ttlMs / 3)));
    this.timer.unref();
    // A replica destroyed without close() (or whose connection is closed under it) must stop
    // refreshing: every later put fails on the closed connection, and the timer would warn about it
    // every few seconds for as long as the process lives. Its entry then expires within the TTL.
    void this.nc.closed().then(() => this.stopRefreshing());
  }

  /** Makes the bucket, or binds to it when it exists. */
  private async open(): Promise<void> {
    this.kv = await new Kvm(this.nc).create(this.bucket, {
      history: 1,
      ttl: this.ttlMs,
      storage: "memory" as never,
      replicas: this.replicas,
    });
  }

  private async refresh(): Promise<void> {
    if (this.refreshing || !this.kv) return;
    this.refreshing = true;
    try {
      await this.kv.put(this.key, this.entry());
    } catch (err) {
      // The bucket is kept in memory: a nats-server that restarted has lost it (the put then finds
      // no stream: "jetstream is not enabled"), and no replica would ever be found again. Make it
      // again and put the entry in it; every replica does the same at its next refresh.
      try {
        await this.open();
        await this.kv.put(this.key, this.entry());
        this.logger.info("the replica registry's bucket was gone (a NATS restart loses it); made it again");
      } catch {
        this.logger.warn({ err: (err as Error).message }, "could not refresh this replica's registry entry");
      }
    } finally {
      this.refreshing = false;
    }
  }

  private stopRefreshing(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** The live replica with this holder id, or undefined when it is unknown or has expired. */
  async lookup(holder: number): Promise<ReplicaEntry | undefined> {
    if (!this.kv) return undefined;
    const e = await this.kv.get(holderHex(holder));
    if (!e || e.operation !== "PUT") return undefined;
    return e.json<ReplicaEntry>();
  }

  /** Leaves the registry at once (a clean stop), instead of waiting for the entry to expire. */
  async close(): Promise<void> {
    this.stopRefreshing();
    await this.kv?.delete(this.key).catch(() => undefined);
  }
}
