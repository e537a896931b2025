// Runs Steps (steps.ts) on a better-sqlite3 database, synchronously; and opens the API's database
// file the way every part of the data layer wants it.
import { chmodSync, closeSync, existsSync, mkdirSync, openSync } from "node:fs";
import { dirname } from "node:path";
import Database from "better-sqlite3";
import { SQLITE } from "./dialect.js";
import { driveSync, type Result, type Step, type Steps, type SqlRunner } from "./steps.js";

/** Statements kept prepared; the lists bound value by value make new texts, so the cache is capped. */
const MAX_PREPARED = 256;

export class SqliteRunner implements SqlRunner {
  readonly dialect = SQLITE;
  private readonly prepared = new Map<string, Database.Statement>();

  constructor(readonly db: Database.Database) {}

  run<T>(steps: Steps<T>): T {
    return driveSync(steps, (s) => this.execute(s));
  }

  /** BEGIN IMMEDIATE: the write lock is taken first, so two processes cannot both pass a check. */
  transaction<T>(steps: Steps<T>): T {
    return this.db.transaction(() => this.run(steps)).immediate();
  }

  private execute(step: Step): Result {
    if ("script" in step) {
      this.db.exec(step.script);
      return { rows: [], changes: 0 };
    }
    const st = this.statement(step.sql);
    if (st.reader) return { rows: st.all(...step.params) as Result["rows"], changes: 0 };
    return { rows: [], changes: st.run(...step.params).changes };
  }

  private statement(sql: string): Database.Statement {
    let st = this.prepared.get(sql);
    if (!st) {
      if (this.prepared.size >= MAX_PREPARED) this.prepared.clear();
      st = this.db.prepare(sql);
      this.prepared.set(sql, st);
    }
    return st;
  }
}

/** Opens (creating its folder) the SQLite file the store, the secret storage and the identities share. */
export function openSqliteFile(path: string): Database.Database {
  if (path !== ":memory:") {
    mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
    // SQLite makes the file (and its -wal and -shm beside it, which take the file's mode) 0644:
    // it holds API key hashes and wrapped secret keys, so it is the stack user's alone
    for (const f of [path, `${path}-wal`, `${path}-shm`]) if (existsSync(f)) chmodSync(f, 0o600);
    if (!existsSync(path)) closeSync(openSync(path, "a", 0o600));
  }
  const db = new Database(path);
  db.pragma("journal_mode = WAL");
  db.pragma("foreign_keys = ON");
  db.pragma("busy_timeout = 5000");
  return db;
}
