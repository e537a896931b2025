// How the secret storage's database rows become its records (storage-types.ts), on either
// database.
import type { Row } from "../db/steps.js";
import type {
  MekRow,
  MekState,
  NekRow,
  ReplicaRow,
  RotationPhase,
  RotationRow,
  SecretRow,
} from "./storage-types.js";

// BIGINT columns and COUNT(*) arrive as strings from node-postgres (as numbers from SQLite); every
// such value here is a millisecond time or a count, far below 2^53
export const num = (v: unknown): number => Number(v);
const numOrNull = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v));

export const mek = (r: Row): MekRow => ({
  kid: r.kid as string,
  state: r.state as MekState,
  addedMs: num(r.added_ms),
  promotedMs: numOrNull(r.promoted_ms),
  retiredMs: numOrNull(r.retired_ms),
});
export const rotation = (r: Row): RotationRow => ({
  rotationId: r.rotation_id as string,
  fromKid: r.from_kid as string,
  toKid: r.to_kid as string,
  phase: r.phase as RotationPhase,
  rolledBack: num(r.rolled_back) === 1,
  startedMs: num(r.started_ms),
  promoteAfterMs: num(r.promote_after_ms),
  promotedMs: numOrNull(r.promoted_ms),
  finishedMs: numOrNull(r.finished_ms),
  neksAtStart: num(r.neks_at_start),
  keyDestroyed: num(r.key_destroyed) === 1,
});
export const nek = (r: Row): NekRow => ({
  nekId: r.nek_id as string,
  namespace: r.namespace as string,
  state: r.state as NekRow["state"],
  mekKid: r.mek_kid as string,
  wrapped: r.wrapped as Buffer,
  encryptions: num(r.encryptions),
  createdMs: num(r.created_ms),
  wrappedMs: num(r.wrapped_ms),
});
export const secret = (r: Row): SecretRow => ({
  functionId: r.function_id as string,
  versionId: r.version_id as string,
  name: r.name as string,
  nekId: r.nek_id as string,
  ciphertext: r.ciphertext as Buffer,
  createdMs: num(r.created_ms),
  updatedMs: num(r.updated_ms),
});
export const replica = (r: Row): ReplicaRow => ({
  replicaId: r.replica_id as string,
  provider: r.provider as string,
  keyIds: JSON.parse(r.key_ids as string) as string[],
  primaryKid: (r.primary_kid as string | null) ?? null,
  seenMs: num(r.seen_ms),
});
