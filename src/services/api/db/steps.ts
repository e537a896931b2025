// The data layer's SQL is written once, as generator functions that yield one statement at a time
// and are handed its result back. A runner executes them: SqliteRunner synchronously inside one
// better-sqlite3 transaction (sqlite.ts), PostgresRunner asynchronously on one pooled connection
// (postgres.ts). That keeps one copy of each rule (which checks and writes make one transaction)
// for both backends, where an async-only interface could not: a better-sqlite3 transaction must
// not wait on a promise, or another request's statements would run inside it.
import type { Dialect } from "./dialect.js";

export type Row = Record<string, unknown>;
export interface Result {
  rows: Row[];
  /** Rows inserted, updated or deleted. */
  changes: number;
}
/** One statement with `?` placeholders, or a script of several statements without parameters. */
export type Step = { sql: string; params: unknown[] } | { script: string };
/** A piece of work on the database that returns T. */
export type Steps<T> = Generator<Step, T, Result>;

/** Runs Steps on one database. */
export interface SqlRunner {
  readonly dialect: Dialect;
  /** Each statement on its own (autocommit). */
  run<T>(steps: Steps<T>): T | Promise<T>;
  /**
   * All statements in one transaction that no other writer runs beside (SQLite's write lock taken
   * at BEGIN; an advisory lock on PostgreSQL), so that the checks in it see every committed write.
   * An error rolls it back.
   */
  transaction<T>(steps: Steps<T>): T | Promise<T>;
}

export function* query(sql: string, params: unknown[] = []): Steps<Row[]> {
  return (yield { sql, params }).rows;
}

export function* first(sql: string, params: unknown[] = []): Steps<Row | undefined> {
  const rows = yield* query(sql, params);
  return rows.length > 0 ? rows[0] : undefined;
}

/** A write; returns how many rows it changed. */
export function* exec(sql: string, params: unknown[] = []): Steps<number> {
  return (yield { sql, params }).changes;
}

export function* script(sql: string): Steps<void> {
  yield { script: sql };
}

export function driveSync<T>(steps: Steps<T>, execute: (s: Step) => Result): T {
  let next = steps.next();
  while (!next.done) next = steps.next(execute(next.value));
  return next.value;
}

export async function driveAsync<T>(steps: Steps<T>, execute: (s: Step) => Promise<Result>): Promise<T> {
  let next = steps.next();
  while (!next.done) next = steps.next(await execute(next.value));
  return next.value;
}
