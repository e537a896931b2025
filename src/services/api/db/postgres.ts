// Runs Steps (steps.ts) on a PostgreSQL pool: a statement alone on any pooled connection, a
// transaction on one connection under an advisory lock.
import type pg from "pg";
import { POSTGRES } from "./dialect.js";
import { driveAsync, type Result, type Step, type Steps, type SqlRunner } from "./steps.js";

/** A query with `?` placeholders (numbered() turns them into $1, $2, ...) and its parameters. */
export type Query = (sql: string, params?: unknown[]) => Promise<pg.QueryResult>;

/** `?` placeholders (the form every query is written in) to PostgreSQL's `$n`. */
export function numbered(sql: string): string {
  let n = 0;
  return sql.replace(/\?/g, () => `$${++n}`);
}

/**
 * Runs `fn` in one transaction on one pooled connection: any error rolls it back. With `lockKey`,
 * the transaction first takes that transaction-scoped advisory lock.
 */
export async function inTransaction<T>(
  pool: pg.Pool,
  fn: (c: pg.PoolClient) => Promise<T>,
  lockKey?: number,
): Promise<T> {
  const c = await pool.connect();
  try {
    await c.query("BEGIN");
    if (lockKey !== undefined) await c.query("SELECT pg_advisory_xact_lock($1)", [lockKey]);
    const out = await fn(c);
    await c.query("COMMIT");
    return out;
  } catch (err) {
    await c.query("ROLLBACK").catch(() => undefined);
    throw err;
  } finally {
    c.release();
  }
}

async function execute(on: pg.Pool | pg.PoolClient, step: Step): Promise<Result> {
  if ("script" in step) {
    await on.query(step.script);
    return { rows: [], changes: 0 };
  }
  const r = await on.query(numbered(step.sql), step.params);
  return { rows: r.rows as Result["rows"], changes: r.rowCount ?? 0 };
}

export class PostgresRunner implements SqlRunner {
  readonly dialect = POSTGRES;

  /**
   * @param lockKey the transaction-scoped advisory lock every transaction of this runner takes
   * first: PostgreSQL's stand-in for SQLite's single write lock, shared by every replica
   */
  constructor(
    readonly pool: pg.Pool,
    private readonly lockKey?: number,
  ) {}

  run<T>(steps: Steps<T>): Promise<T> {
    return driveAsync(steps, (s) => execute(this.pool, s));
  }

  transaction<T>(steps: Steps<T>): Promise<T> {
    return inTransaction(this.pool, (c) => driveAsync(steps, (s) => execute(c, s)), this.lockKey);
  }
}
