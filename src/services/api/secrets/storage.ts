// Where the secret store keeps its rows: SecretStorage (storage-types.ts) over either database. The
// SQL is written once (storage-steps.ts); this class says which operations are one transaction, in
// which the checks that keep rotation safe across replicas are made. The schema is part of the
// data layer's one list of migrations (../db/migrations.ts). openSqliteSecretStorage opens it on
// the API's SQLite file; storage-postgres.ts on PostgreSQL.
import type Database from "better-sqlite3";
import type { Dialect } from "../db/dialect.js";
import { migrateSqlite } from "../db/migrate.js";
import { SqliteRunner } from "../db/sqlite.js";
import type { SqlRunner } from "../db/steps.js";
import * as sql from "./storage-steps.js";
import type { NekRow, ReplicaRow, RotationRow, SecretRow, SecretStorage } from "./storage-types.js";

export type {
  MekRow,
  MekState,
  NekRow,
  ReplicaRow,
  RotationPhase,
  RotationRow,
  SecretRow,
  SecretStorage,
} from "./storage-types.js";

export class SqlSecretStorage implements SecretStorage {
  private readonly d: Dialect;

  constructor(private readonly db: SqlRunner) {
    this.d = db.dialect;
  }

  async meks() {
    return await this.db.run(sql.meks());
  }
  async bootstrapMek(kid: string, now: number) {
    return await this.db.transaction(sql.bootstrapMek(kid, now));
  }
  async latestRotation() {
    return await this.db.run(sql.latestRotation(this.d));
  }
  async startRotation(r: RotationRow) {
    return await this.db.transaction(sql.startRotation(r));
  }
  async promote(rotationId: string, now: number) {
    return await this.db.transaction(sql.promote(rotationId, now));
  }
  async retire(rotationId: string, now: number) {
    return await this.db.transaction(sql.retire(rotationId, now));
  }
  async abortBeforePromotion(rotationId: string, now: number) {
    return await this.db.transaction(sql.abortBeforePromotion(rotationId, now));
  }
  async rollBack(rotationId: string, now: number) {
    return await this.db.transaction(sql.rollBack(rotationId, now));
  }
  async markKeyDestroyed(rotationId: string) {
    await this.db.run(sql.markKeyDestroyed(rotationId));
  }

  async activeNek(namespace: string) {
    return await this.db.run(sql.activeNek(namespace));
  }
  async nek(nekId: string) {
    return await this.db.run(sql.nekById(nekId));
  }
  async insertNek(n: NekRow, retireActive: boolean) {
    return await this.db.transaction(sql.insertNek(n, retireActive));
  }
  async neksNotUnder(kid: string, limit: number, skip: ReadonlySet<string>) {
    return await this.db.run(sql.neksNotUnder(this.d, kid, limit, skip));
  }
  async rewrapNek(nekId: string, fromKid: string, toKid: string, wrapped: Buffer, now: number) {
    return await this.db.transaction(sql.rewrapNek(nekId, fromKid, toKid, wrapped, now));
  }
  async neksByMek() {
    return await this.db.run(sql.neksByMek());
  }
  async retiringNeks(limit: number) {
    return await this.db.run(sql.retiringNeks(limit));
  }
  async nekStats() {
    return await this.db.run(sql.nekStats());
  }
  async deleteNekIfUnused(nekId: string) {
    return await this.db.transaction(sql.deleteNekIfUnused(nekId));
  }
  async namespaces() {
    return await this.db.run(sql.namespaces());
  }

  async putSecrets(rows: SecretRow[]): Promise<"stored" | "nek-gone"> {
    if (rows.length === 0) return "stored";
    return await this.db.transaction(sql.putSecrets(rows));
  }
  async reencrypt(
    versionId: string,
    name: string,
    fromNek: string,
    toNek: string,
    ciphertext: Buffer,
    now: number,
  ) {
    return await this.db.transaction(sql.reencrypt(versionId, name, fromNek, toNek, ciphertext, now));
  }
  async secrets(versionId: string) {
    return await this.db.run(sql.secrets(versionId));
  }
  async secret(versionId: string, name: string) {
    return await this.db.run(sql.secretByName(versionId, name));
  }
  async secretsUnderNek(nekId: string, limit: number, skip: ReadonlySet<string>) {
    return await this.db.run(sql.secretsUnderNek(this.d, nekId, limit, skip));
  }
  async countSecretsUnderNek(nekId: string) {
    return await this.db.run(sql.countSecretsUnderNek(nekId));
  }
  async deleteSecret(versionId: string, name: string) {
    return await this.db.transaction(sql.deleteSecret(versionId, name));
  }
  async deleteVersion(versionId: string) {
    return await this.db.transaction(sql.deleteVersion(versionId));
  }
  async deleteNamespace(namespace: string, functionId: string) {
    await this.db.transaction(sql.deleteNamespace(namespace, functionId));
  }
  async names(versionIds?: readonly string[]) {
    return await this.db.run(sql.names(this.d, versionIds));
  }
  async revisions() {
    return await this.db.run(sql.revisions());
  }

  async heartbeat(r: ReplicaRow) {
    await this.db.run(sql.heartbeat(r));
  }
  async replicas() {
    return await this.db.run(sql.replicas());
  }
  async pruneReplicas(olderThanMs: number) {
    await this.db.run(sql.pruneReplicas(olderThanMs));
  }
  async removeReplica(replicaId: string) {
    await this.db.run(sql.removeReplica(replicaId));
  }
}

/**
 * The secret storage in the API's SQLite file (the store's connection). Its statements run
 * synchronously, each write transaction BEGIN IMMEDIATE: SQLite's one write lock serializes it with
 * every other process's.
 */
export function openSqliteSecretStorage(db: Database.Database): SecretStorage {
  migrateSqlite(db);
  return new SqlSecretStorage(new SqliteRunner(db));
}
