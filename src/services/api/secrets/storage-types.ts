// The secret storage's interface and the rows it reads and writes: wrapped NEKs, encrypted secret
// values, the MEK states and rotations, and a heartbeat per API replica. Every method that writes
// more than one row is one transaction; the checks that keep rotation safe across replicas (never
// wrap under a retired MEK, never retire a MEK that still wraps a NEK, never delete a NEK a secret
// still uses) are made inside those transactions. storage.ts re-exports all of it.

export type MekState = "primary" | "decrypt-only" | "retired";
export type RotationPhase = "distributing" | "rewrapping" | "done" | "aborted";

export interface MekRow {
  kid: string;
  state: MekState;
  addedMs: number;
  promotedMs: number | null;
  retiredMs: number | null;
}

export interface RotationRow {
  rotationId: string;
  fromKid: string;
  toKid: string;
  phase: RotationPhase;
  rolledBack: boolean;
  startedMs: number;
  promoteAfterMs: number;
  promotedMs: number | null;
  finishedMs: number | null;
  neksAtStart: number;
  keyDestroyed: boolean;
}

export interface NekRow {
  nekId: string;
  namespace: string;
  state: "active" | "retiring";
  mekKid: string;
  wrapped: Buffer;
  encryptions: number;
  createdMs: number;
  wrappedMs: number;
}

export interface SecretRow {
  functionId: string;
  versionId: string;
  name: string;
  nekId: string;
  ciphertext: Buffer;
  createdMs: number;
  updatedMs: number;
}

export interface ReplicaRow {
  replicaId: string;
  provider: string;
  keyIds: string[];
  primaryKid: string | null;
  seenMs: number;
}

export interface SecretStorage {
  meks(): Promise<MekRow[]>;
  /** Makes `kid` the primary MEK if there is none yet (the first start); false if another was first. */
  bootstrapMek(kid: string, now: number): Promise<boolean>;
  latestRotation(): Promise<RotationRow | undefined>;
  /** Adds `toKid` decrypt-only and opens a rotation; "open" if one is already open. */
  startRotation(r: RotationRow): Promise<"started" | "open">;
  promote(rotationId: string, now: number): Promise<boolean>;
  /** Retires the old MEK once no NEK is wrapped with it; false while one still is. */
  retire(rotationId: string, now: number): Promise<boolean>;
  abortBeforePromotion(rotationId: string, now: number): Promise<boolean>;
  rollBack(rotationId: string, now: number): Promise<boolean>;
  markKeyDestroyed(rotationId: string): Promise<void>;

  activeNek(namespace: string): Promise<NekRow | undefined>;
  nek(nekId: string): Promise<NekRow | undefined>;
  /** Inserts a NEK; "retired-mek" if its MEK was retired meanwhile, "exists" if the namespace has an active one. */
  insertNek(n: NekRow, retireActive: boolean): Promise<"inserted" | "exists" | "retired-mek">;
  neksNotUnder(kid: string, limit: number, skip: ReadonlySet<string>): Promise<NekRow[]>;
  rewrapNek(nekId: string, fromKid: string, toKid: string, wrapped: Buffer, now: number): Promise<boolean>;
  neksByMek(): Promise<Map<string, number>>;
  retiringNeks(limit: number): Promise<NekRow[]>;
  nekStats(): Promise<{ total: number; retiring: number; maxEncryptions: number }>;
  /** Deletes a NEK no secret uses; false if one does. */
  deleteNekIfUnused(nekId: string): Promise<boolean>;
  namespaces(): Promise<string[]>;

  /** Upserts secrets of one version, counts the encryptions on their NEK, bumps the version's revision. */
  putSecrets(rows: SecretRow[]): Promise<"stored" | "nek-gone">;
  /** Replaces one secret's ciphertext if it is still under `fromNek` (NEK rotation). */
  reencrypt(
    versionId: string,
    name: string,
    fromNek: string,
    toNek: string,
    ciphertext: Buffer,
    now: number,
  ): Promise<boolean>;
  secrets(versionId: string): Promise<SecretRow[]>;
  secret(versionId: string, name: string): Promise<SecretRow | undefined>;
  secretsUnderNek(nekId: string, limit: number, skip: ReadonlySet<string>): Promise<SecretRow[]>;
  countSecretsUnderNek(nekId: string): Promise<number>;
  deleteSecret(versionId: string, name: string): Promise<boolean>;
  deleteVersion(versionId: string): Promise<number>;
  deleteNamespace(namespace: string, functionId: string): Promise<void>;
  names(versionIds?: readonly string[]): Promise<Map<string, string[]>>;
  revisions(): Promise<Map<string, number>>;

  heartbeat(r: ReplicaRow): Promise<void>;
  replicas(): Promise<ReplicaRow[]>;
  pruneReplicas(olderThanMs: number): Promise<void>;
  removeReplica(replicaId: string): Promise<void>;
}
