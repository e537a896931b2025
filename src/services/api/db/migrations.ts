// The one list of schema migrations of the API's database: the store's tables, the secret
// storage's and the worker identities', on SQLite and PostgreSQL alike. Each runs once, in order;
// never edit a shipped one, add the next. The SQL is written once: plain constraints and indexes
// that both accept, and the types that differ by dialect taken from ColumnTypes (dialect.ts).
import type { ColumnTypes } from "./dialect.js";

export interface Migration {
  version: number;
  /** The part of the data layer whose tables it makes. */
  part: "store" | "secrets" | "identity";
  name: string;
  sql: (t: ColumnTypes) => string;
  /**
   * Before this runner, the secret storage kept its own migration table and the identity store
   * created its table if missing. A database made then has this table exactly when it has this
   * migration's schema (each was made in one statement or transaction): the runner then records the
   * migration as applied without running it.
   */
  adoptIfTableExists?: string;
}

export const MIGRATIONS: readonly Migration[] = [
  {
    // version 1 and its name as the store's own list recorded them, so its databases need nothing
    version: 1,
    part: "store",
    name: "functions, deployments, instances, api keys",
    sql: (t) => `
      CREATE TABLE functions (
        function_id TEXT PRIMARY KEY,
        name        TEXT NOT NULL UNIQUE,
        nca_id      TEXT NOT NULL,
        created_at  ${t.isoTime} NOT NULL
      );
      CREATE TABLE function_versions (
        version_id  TEXT PRIMARY KEY,
        function_id TEXT NOT NULL REFERENCES functions(function_id),
        spec        TEXT NOT NULL,
        created_at  ${t.isoTime} NOT NULL
      );
      CREATE INDEX function_versions_by_function ON function_versions(function_id);
      CREATE TABLE deployments (
        deployment_id TEXT PRIMARY KEY,
        function_id   TEXT NOT NULL,
        version_id    TEXT NOT NULL UNIQUE REFERENCES function_versions(version_id),
        specs         TEXT NOT NULL,
        created_at    ${t.isoTime} NOT NULL,
        updated_at    ${t.isoTime} NOT NULL
      );
      CREATE TABLE instances (
        instance_id   TEXT PRIMARY KEY,
        reporter      TEXT NOT NULL,
        deployment_id TEXT NOT NULL,
        function_id   TEXT NOT NULL,
        version_id    TEXT NOT NULL,
        status        TEXT NOT NULL,
        instance_type TEXT NOT NULL,
        gpu           TEXT NOT NULL,
        backend       TEXT NOT NULL,
        location      TEXT NOT NULL,
        message       TEXT,
        created_at    ${t.isoTime} NOT NULL,
        updated_at    ${t.isoTime} NOT NULL
      );
      CREATE INDEX instances_by_version ON instances(version_id);
      CREATE TABLE api_keys (
        key_id      TEXT PRIMARY KEY,
        hash        TEXT NOT NULL UNIQUE,
        description TEXT NOT NULL,
        owner_id    TEXT NOT NULL,
        scopes      TEXT NOT NULL,
        expires_at  ${t.isoTime} NOT NULL,
        created_at  ${t.isoTime} NOT NULL,
        revoked_at  ${t.isoTime}
      );
    `,
  },
  {
    version: 2,
    part: "secrets",
    name: "MEK states and rotations, wrapped NEKs, encrypted secret values, replica heartbeats",
    adoptIfTableExists: "secret_meks",
    sql: (t) => `
      CREATE TABLE secret_meks (
        kid         TEXT PRIMARY KEY,
        state       TEXT NOT NULL CHECK (state IN ('primary', 'decrypt-only', 'retired')),
        added_ms    ${t.int64} NOT NULL,
        promoted_ms ${t.int64},
        retired_ms  ${t.int64}
      );
      CREATE UNIQUE INDEX secret_meks_one_primary ON secret_meks(state) WHERE state = 'primary';
      CREATE TABLE secret_mek_rotations (
        rotation_id      TEXT PRIMARY KEY,
        from_kid         TEXT NOT NULL,
        to_kid           TEXT NOT NULL,
        phase            TEXT NOT NULL CHECK (phase IN ('distributing', 'rewrapping', 'done', 'aborted')),
        open             ${t.flag} UNIQUE,
        rolled_back      ${t.flag} NOT NULL DEFAULT 0,
        started_ms       ${t.int64} NOT NULL,
        promote_after_ms ${t.int64} NOT NULL,
        promoted_ms      ${t.int64},
        finished_ms      ${t.int64},
        neks_at_start    INTEGER NOT NULL,
        key_destroyed    ${t.flag} NOT NULL DEFAULT 0${t.insertionOrderColumn}
      );
      CREATE TABLE secret_neks (
        nek_id      TEXT PRIMARY KEY,
        namespace   TEXT NOT NULL,
        state       TEXT NOT NULL CHECK (state IN ('active', 'retiring')),
        mek_kid     TEXT NOT NULL,
        wrapped     ${t.bytes} NOT NULL,
        encryptions ${t.int64} NOT NULL DEFAULT 0,
        created_ms  ${t.int64} NOT NULL,
        wrapped_ms  ${t.int64} NOT NULL
      );
      CREATE UNIQUE INDEX secret_neks_one_active ON secret_neks(namespace) WHERE state = 'active';
      CREATE INDEX secret_neks_by_mek ON secret_neks(mek_kid);
      CREATE TABLE secret_values (
        version_id  TEXT NOT NULL,
        name        TEXT NOT NULL,
        function_id TEXT NOT NULL,
        nek_id      TEXT NOT NULL REFERENCES secret_neks(nek_id),
        ciphertext  ${t.bytes} NOT NULL,
        created_ms  ${t.int64} NOT NULL,
        updated_ms  ${t.int64} NOT NULL,
        PRIMARY KEY (version_id, name)
      );
      CREATE INDEX secret_values_by_nek ON secret_values(nek_id);
      CREATE INDEX secret_values_by_function ON secret_values(function_id);
      CREATE TABLE secret_revisions (
        version_id TEXT PRIMARY KEY,
        revision   ${t.int64} NOT NULL
      );
      CREATE TABLE secret_replicas (
        replica_id  TEXT PRIMARY KEY,
        provider    TEXT NOT NULL,
        key_ids     TEXT NOT NULL,
        primary_kid TEXT,
        seen_ms     ${t.int64} NOT NULL
      );
    `,
  },
  {
    version: 3,
    part: "identity",
    name: "worker identities",
    adoptIfTableExists: "worker_identities",
    sql: (t) => `
      CREATE TABLE worker_identities (
        instance_id   TEXT PRIMARY KEY,
        function_id   TEXT NOT NULL,
        version_id    TEXT NOT NULL,
        deployment_id TEXT NOT NULL,
        status        TEXT NOT NULL,
        issued_at     ${t.isoTime} NOT NULL,
        expires_at    ${t.isoTime} NOT NULL,
        revoked_at    ${t.isoTime},
        revoked_why   TEXT
      );
    `,
  },
  {
    version: 4,
    part: "store",
    name: "accounts, each key's account and policies, function authorizations, revoked admin tokens",
    // keys made before accounts have nca_id '' until the API's first start gives them its default
    // account (Store.adoptIntoAccount)
    sql: (t) => `
      CREATE TABLE accounts (
        nca_id     TEXT PRIMARY KEY,
        name       TEXT NOT NULL UNIQUE,
        created_at ${t.isoTime} NOT NULL
      );
      ALTER TABLE api_keys ADD COLUMN nca_id TEXT NOT NULL DEFAULT '';
      ALTER TABLE api_keys ADD COLUMN policies TEXT;
      CREATE INDEX api_keys_by_account ON api_keys(nca_id);
      CREATE INDEX functions_by_account ON functions(nca_id);
      CREATE TABLE function_authorizations (
        function_id TEXT NOT NULL,
        nca_id      TEXT NOT NULL,
        created_at  ${t.isoTime} NOT NULL,
        PRIMARY KEY (function_id, nca_id)
      );
      CREATE INDEX function_authorizations_by_account ON function_authorizations(nca_id);
      CREATE TABLE revoked_admin_tokens (
        token_id   TEXT PRIMARY KEY,
        revoked_at ${t.isoTime} NOT NULL
      );
    `,
  },
  {
    version: 5,
    part: "store",
    name: "clusters and the instance types they offer, each instance's worker identity",
    // a cluster's list is one JSON document, so that registering replaces it in one statement (no
    // replica sees half of an old list and half of a new one); lists are small (256 types at most)
    // and read whole. worker_auth is NULL for instances reported without an identity.
    sql: (t) => `
      CREATE TABLE clusters (
        cluster_id     TEXT PRIMARY KEY,
        backend        TEXT NOT NULL,
        instance_types TEXT NOT NULL,
        updated_at     ${t.isoTime} NOT NULL
      );
      ALTER TABLE instances ADD COLUMN worker_auth TEXT;
    `,
  },
  {
    version: 6,
    part: "store",
    name: "each cluster's service-account keys, each instance's worker subject",
    // a cluster's key set is one JSON document replaced in one statement, as its instance types are:
    // no replica verifies against half an old set. agent_subject: the service account of the
    // cluster's compute agent, pinned by its first proof (NULL until then): only it proves after. worker_sub is the pod service account a worker's
    // token names (NULL for instances without a pod identity), indexed: a pod token is looked up by it.
    sql: (t) => `
      CREATE TABLE cluster_keys (
        cluster_id  TEXT PRIMARY KEY,
        issuer      TEXT NOT NULL,
        jwks        TEXT NOT NULL,
        jwks_hash   TEXT NOT NULL,
        agent_subject TEXT,
        updated_by  TEXT NOT NULL,
        updated_at  ${t.isoTime} NOT NULL
      );
      ALTER TABLE instances ADD COLUMN worker_sub TEXT;
      CREATE INDEX instances_by_worker_sub ON instances(worker_sub);
    `,
  },
  {
    version: 7,
    part: "store",
    name: "the operator console's audit log",
    // one row per action an operator took in the console (scale, undeploy, revoke-identity): who,
    // what, on what; detail is a JSON document (the action's fields). Read newest first, paged; the
    // insertion order breaks ties between actions of the same millisecond.
    sql: (t) => `
      CREATE TABLE audit_log (
        id      TEXT PRIMARY KEY,
        at      ${t.isoTime} NOT NULL,
        actor   TEXT NOT NULL,
        action  TEXT NOT NULL,
        target  TEXT NOT NULL,
        detail  TEXT NOT NULL${t.insertionOrderColumn}
      );
      CREATE INDEX audit_log_by_time ON audit_log(at);
    `,
  },
  {
    version: 8,
    part: "store",
    name: "the audit log's who: the admin token's subject and id",
    // actor held the token's subject (or "token <id>" for a token without one); it is named for what
    // it holds, and the token's id (jti) gets a column of its own. Rows written before keep the id
    // in detail.tokenId only (reading it out of JSON differs by dialect; detail still shows it).
    sql: () => `
      ALTER TABLE audit_log RENAME COLUMN actor TO subject;
      ALTER TABLE audit_log ADD COLUMN token_id TEXT;
    `,
  },
];
