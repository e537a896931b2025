// The secret storage's SQL, written once for SQLite and PostgreSQL: one generator of Steps
// (../db/steps.ts) per operation. Which operations run as one transaction is said by
// SqlSecretStorage (storage.ts); what differs by dialect comes from the Dialect (../db/dialect.ts).
import type { Dialect } from "../db/dialect.js";
import { exec, first, query, type Steps } from "../db/steps.js";
import { mek, nek, num, replica, rotation, secret } from "./storage-rows.js";
import type { MekRow, MekState, NekRow, ReplicaRow, RotationRow, SecretRow } from "./storage-types.js";

function* count(sql: string, params: unknown[]): Steps<number> {
  return num((yield* first(sql, params))?.n);
}
function* mekState(kid: string): Steps<MekState | undefined> {
  return (yield* first("SELECT state FROM secret_meks WHERE kid = ?", [kid]))?.state as MekState | undefined;
}
function* rotationById(rotationId: string): Steps<RotationRow | undefined> {
  const r = yield* first("SELECT * FROM secret_mek_rotations WHERE rotation_id = ?", [rotationId]);
  return r && rotation(r);
}
const neksUnderMek = (kid: string) => count("SELECT COUNT(*) AS n FROM secret_neks WHERE mek_kid = ?", [kid]);
const bumpRevision = (versionId: string) =>
  exec(
    "INSERT INTO secret_revisions (version_id, revision) VALUES (?, 1) ON CONFLICT (version_id) DO UPDATE SET revision = secret_revisions.revision + 1",
    [versionId],
  );

// MEKs and their rotations

export function* meks(): Steps<MekRow[]> {
  return (yield* query("SELECT * FROM secret_meks ORDER BY added_ms, kid")).map(mek);
}

export function* bootstrapMek(kid: string, now: number): Steps<boolean> {
  if (yield* first("SELECT 1 FROM secret_meks LIMIT 1")) return false;
  yield* exec("INSERT INTO secret_meks (kid, state, added_ms, promoted_ms) VALUES (?, 'primary', ?, ?)", [
    kid,
    now,
    now,
  ]);
  return true;
}

export function* latestRotation(d: Dialect): Steps<RotationRow | undefined> {
  const r = yield* first(
    `SELECT * FROM secret_mek_rotations ORDER BY started_ms DESC, ${d.insertionOrder} DESC LIMIT 1`,
  );
  return r && rotation(r);
}

export function* startRotation(r: RotationRow): Steps<"started" | "open"> {
  if (yield* first("SELECT 1 FROM secret_mek_rotations WHERE open = 1")) return "open";
  const known = yield* mekState(r.toKid);
  if (known) throw new Error(`the MEK ${r.toKid} is already known (${known})`);
  yield* exec("INSERT INTO secret_meks (kid, state, added_ms) VALUES (?, 'decrypt-only', ?)", [
    r.toKid,
    r.startedMs,
  ]);
  yield* exec(
    `INSERT INTO secret_mek_rotations (rotation_id, from_kid, to_kid, phase, open, rolled_back, started_ms, promote_after_ms, neks_at_start)
     VALUES (?, ?, ?, 'distributing', 1, 0, ?, ?, ?)`,
    [r.rotationId, r.fromKid, r.toKid, r.startedMs, r.promoteAfterMs, r.neksAtStart],
  );
  return "started";
}

export function* promote(rotationId: string, now: number): Steps<boolean> {
  const r = yield* rotationById(rotationId);
  if (!r || r.phase !== "distributing") return false;
  yield* exec("UPDATE secret_meks SET state = 'decrypt-only' WHERE kid = ? AND state = 'primary'", [
    r.fromKid,
  ]);
  yield* exec("UPDATE secret_meks SET state = 'primary', promoted_ms = ? WHERE kid = ?", [now, r.toKid]);
  yield* exec("UPDATE secret_mek_rotations SET phase = 'rewrapping', promoted_ms = ? WHERE rotation_id = ?", [
    now,
    rotationId,
  ]);
  return true;
}

export function* retire(rotationId: string, now: number): Steps<boolean> {
  const r = yield* rotationById(rotationId);
  if (!r || r.phase !== "rewrapping") return false;
  if ((yield* neksUnderMek(r.fromKid)) > 0) return false;
  yield* exec("UPDATE secret_meks SET state = 'retired', retired_ms = ? WHERE kid = ?", [now, r.fromKid]);
  yield* exec(
    "UPDATE secret_mek_rotations SET phase = 'done', open = NULL, finished_ms = ? WHERE rotation_id = ?",
    [now, rotationId],
  );
  return true;
}

export function* abortBeforePromotion(rotationId: string, now: number): Steps<boolean> {
  const r = yield* rotationById(rotationId);
  if (!r || r.phase !== "distributing") return false;
  // nothing can be wrapped with a key that was never primary, but be sure
  if ((yield* neksUnderMek(r.toKid)) > 0) return false;
  yield* exec("UPDATE secret_meks SET state = 'retired', retired_ms = ? WHERE kid = ?", [now, r.toKid]);
  yield* exec(
    "UPDATE secret_mek_rotations SET phase = 'aborted', open = NULL, finished_ms = ? WHERE rotation_id = ?",
    [now, rotationId],
  );
  return true;
}

export function* rollBack(rotationId: string, now: number): Steps<boolean> {
  const r = yield* rotationById(rotationId);
  if (!r || r.phase !== "rewrapping") return false;
  yield* exec("UPDATE secret_meks SET state = 'decrypt-only' WHERE kid = ?", [r.toKid]);
  yield* exec("UPDATE secret_meks SET state = 'primary', promoted_ms = ? WHERE kid = ?", [now, r.fromKid]);
  // the same rotation, backwards: re-wrap onto the old key, then retire the new one
  yield* exec(
    "UPDATE secret_mek_rotations SET from_kid = ?, to_kid = ?, rolled_back = 1, promoted_ms = ? WHERE rotation_id = ?",
    [r.toKid, r.fromKid, now, rotationId],
  );
  return true;
}

export function* markKeyDestroyed(rotationId: string): Steps<void> {
  yield* exec("UPDATE secret_mek_rotations SET key_destroyed = 1 WHERE rotation_id = ?", [rotationId]);
}

// NEKs

export function* activeNek(namespace: string): Steps<NekRow | undefined> {
  const r = yield* first("SELECT * FROM secret_neks WHERE namespace = ? AND state = 'active'", [namespace]);
  return r && nek(r);
}

export function* nekById(nekId: string): Steps<NekRow | undefined> {
  const r = yield* first("SELECT * FROM secret_neks WHERE nek_id = ?", [nekId]);
  return r && nek(r);
}

export function* insertNek(n: NekRow, retireActive: boolean): Steps<"inserted" | "exists" | "retired-mek"> {
  const s = yield* mekState(n.mekKid);
  if (!s || s === "retired") return "retired-mek";
  const active = yield* first("SELECT nek_id FROM secret_neks WHERE namespace = ? AND state = 'active'", [
    n.namespace,
  ]);
  if (active) {
    if (!retireActive) return "exists";
    yield* exec("UPDATE secret_neks SET state = 'retiring' WHERE nek_id = ?", [active.nek_id]);
  }
  yield* exec(
    `INSERT INTO secret_neks (nek_id, namespace, state, mek_kid, wrapped, encryptions, created_ms, wrapped_ms)
     VALUES (?, ?, 'active', ?, ?, 0, ?, ?)`,
    [n.nekId, n.namespace, n.mekKid, n.wrapped, n.createdMs, n.wrappedMs],
  );
  return "inserted";
}

/** `skip`: ids known to fail this round. */
export function* neksNotUnder(
  d: Dialect,
  kid: string,
  limit: number,
  skip: ReadonlySet<string>,
): Steps<NekRow[]> {
  const x = d.andNoneOf("nek_id", skip);
  return (yield* query(`SELECT * FROM secret_neks WHERE mek_kid <> ?${x.sql} ORDER BY wrapped_ms LIMIT ?`, [
    kid,
    ...x.params,
    limit,
  ])).map(nek);
}

export function* rewrapNek(
  nekId: string,
  fromKid: string,
  toKid: string,
  wrapped: Buffer,
  now: number,
): Steps<boolean> {
  const s = yield* mekState(toKid);
  if (!s || s === "retired") return false;
  const changed = yield* exec(
    "UPDATE secret_neks SET mek_kid = ?, wrapped = ?, wrapped_ms = ? WHERE nek_id = ? AND mek_kid = ?",
    [toKid, wrapped, now, nekId, fromKid],
  );
  return changed === 1;
}

export function* neksByMek(): Steps<Map<string, number>> {
  const rows = yield* query("SELECT mek_kid, COUNT(*) AS n FROM secret_neks GROUP BY mek_kid");
  return new Map(rows.map((r) => [r.mek_kid as string, num(r.n)]));
}

export function* retiringNeks(limit: number): Steps<NekRow[]> {
  return (yield* query("SELECT * FROM secret_neks WHERE state = 'retiring' ORDER BY created_ms LIMIT ?", [
    limit,
  ])).map(nek);
}

export function* nekStats(): Steps<{ total: number; retiring: number; maxEncryptions: number }> {
  const r = yield* first(
    "SELECT COUNT(*) AS total, COALESCE(SUM(CASE WHEN state = 'retiring' THEN 1 ELSE 0 END), 0) AS retiring, COALESCE(MAX(encryptions), 0) AS max FROM secret_neks",
  );
  return { total: num(r?.total), retiring: num(r?.retiring), maxEncryptions: num(r?.max) };
}

export function* deleteNekIfUnused(nekId: string): Steps<boolean> {
  if ((yield* countSecretsUnderNek(nekId)) > 0) return false;
  return (yield* exec("DELETE FROM secret_neks WHERE nek_id = ?", [nekId])) === 1;
}

export function* namespaces(): Steps<string[]> {
  return (yield* query("SELECT DISTINCT namespace FROM secret_neks ORDER BY namespace")).map(
    (r) => r.namespace as string,
  );
}

// secret values and their versions' revisions

export function* putSecrets(rows: SecretRow[]): Steps<"stored" | "nek-gone"> {
  const perNek = new Map<string, number>();
  for (const r of rows) perNek.set(r.nekId, (perNek.get(r.nekId) ?? 0) + 1);
  for (const [id, n] of perNek)
    if ((yield* exec("UPDATE secret_neks SET encryptions = encryptions + ? WHERE nek_id = ?", [n, id])) !== 1)
      return "nek-gone";
  for (const r of rows)
    yield* exec(
      `INSERT INTO secret_values (version_id, name, function_id, nek_id, ciphertext, created_ms, updated_ms)
       VALUES (?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (version_id, name) DO UPDATE SET nek_id = excluded.nek_id, ciphertext = excluded.ciphertext, updated_ms = excluded.updated_ms`,
      [r.versionId, r.name, r.functionId, r.nekId, r.ciphertext, r.createdMs, r.updatedMs],
    );
  for (const v of new Set(rows.map((r) => r.versionId))) yield* bumpRevision(v);
  return "stored";
}

export function* reencrypt(
  versionId: string,
  name: string,
  fromNek: string,
  toNek: string,
  ciphertext: Buffer,
  now: number,
): Steps<boolean> {
  const changed = yield* exec(
    "UPDATE secret_values SET nek_id = ?, ciphertext = ?, updated_ms = ? WHERE version_id = ? AND name = ? AND nek_id = ?",
    [toNek, ciphertext, now, versionId, name, fromNek],
  );
  if (changed !== 1) return false;
  yield* exec("UPDATE secret_neks SET encryptions = encryptions + 1 WHERE nek_id = ?", [toNek]);
  return true;
}

export function* secrets(versionId: string): Steps<SecretRow[]> {
  return (yield* query("SELECT * FROM secret_values WHERE version_id = ? ORDER BY name", [versionId])).map(
    secret,
  );
}

export function* secretByName(versionId: string, name: string): Steps<SecretRow | undefined> {
  const r = yield* first("SELECT * FROM secret_values WHERE version_id = ? AND name = ?", [versionId, name]);
  return r && secret(r);
}

/** `skip`: "versionId/name" of the secrets known to fail this round. */
export function* secretsUnderNek(
  d: Dialect,
  nekId: string,
  limit: number,
  skip: ReadonlySet<string>,
): Steps<SecretRow[]> {
  const x = d.andNoneOf("(version_id || '/' || name)", skip);
  return (yield* query(`SELECT * FROM secret_values WHERE nek_id = ?${x.sql} ORDER BY updated_ms LIMIT ?`, [
    nekId,
    ...x.params,
    limit,
  ])).map(secret);
}

export function countSecretsUnderNek(nekId: string): Steps<number> {
  return count("SELECT COUNT(*) AS n FROM secret_values WHERE nek_id = ?", [nekId]);
}

export function* deleteSecret(versionId: string, name: string): Steps<boolean> {
  const changed = yield* exec("DELETE FROM secret_values WHERE version_id = ? AND name = ?", [
    versionId,
    name,
  ]);
  if (changed === 1) yield* bumpRevision(versionId);
  return changed === 1;
}

export function* deleteVersion(versionId: string): Steps<number> {
  const changed = yield* exec("DELETE FROM secret_values WHERE version_id = ?", [versionId]);
  yield* exec("DELETE FROM secret_revisions WHERE version_id = ?", [versionId]);
  return changed;
}

export function* deleteNamespace(namespace: string, functionId: string): Steps<void> {
  yield* exec(
    "DELETE FROM secret_revisions WHERE version_id IN (SELECT DISTINCT version_id FROM secret_values WHERE function_id = ?)",
    [functionId],
  );
  yield* exec("DELETE FROM secret_values WHERE function_id = ?", [functionId]);
  yield* exec("DELETE FROM secret_neks WHERE namespace = ?", [namespace]);
}

export function* names(d: Dialect, versionIds?: readonly string[]): Steps<Map<string, string[]>> {
  const out = new Map<string, string[]>();
  if (versionIds?.length === 0) return out;
  // a list longer than the dialect binds value by value (every version, for a function listing):
  // then read every name and keep the ones asked for
  const all = versionIds === undefined || versionIds.length > d.maxListParams;
  const wanted = versionIds && all ? new Set(versionIds) : undefined;
  const where = all ? { sql: "", params: [] } : d.anyOf("version_id", versionIds);
  const rows = yield* query(
    `SELECT version_id, name FROM secret_values${where.sql && ` WHERE ${where.sql}`} ORDER BY version_id, name`,
    where.params,
  );
  for (const r of rows) {
    const v = r.version_id as string;
    if (wanted && !wanted.has(v)) continue;
    const list = out.get(v) ?? [];
    list.push(r.name as string);
    out.set(v, list);
  }
  return out;
}

export function* revisions(): Steps<Map<string, number>> {
  const rows = yield* query("SELECT version_id, revision FROM secret_revisions");
  return new Map(rows.map((r) => [r.version_id as string, num(r.revision)]));
}

// the API replicas' heartbeats

export function* heartbeat(r: ReplicaRow): Steps<void> {
  yield* exec(
    `INSERT INTO secret_replicas (replica_id, provider, key_ids, primary_kid, seen_ms) VALUES (?, ?, ?, ?, ?)
     ON CONFLICT (replica_id) DO UPDATE SET provider = excluded.provider, key_ids = excluded.key_ids, primary_kid = excluded.primary_kid, seen_ms = excluded.seen_ms`,
    [r.replicaId, r.provider, JSON.stringify(r.keyIds), r.primaryKid, r.seenMs],
  );
}

export function* replicas(): Steps<ReplicaRow[]> {
  return (yield* query("SELECT * FROM secret_replicas ORDER BY seen_ms DESC")).map(replica);
}

export function* pruneReplicas(olderThanMs: number): Steps<void> {
  yield* exec("DELETE FROM secret_replicas WHERE seen_ms < ?", [olderThanMs]);
}

export function* removeReplica(replicaId: string): Steps<void> {
  yield* exec("DELETE FROM secret_replicas WHERE replica_id = ?", [replicaId]);
}
