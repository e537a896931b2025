// Runs Steps (steps.ts) on a PostgreSQL pool: a statement alone on any pooled connection, a
// transaction on one connection under an advisory lock.
import type pg from "pg";
import { POSTGRES } from "./dialect.js";
import { driveAsync, type Result, type Step, type Steps, type SqlRunner } from "./steps.js";

/** `?` placeholders (the form every query is written in) to PostgreSQL's `$n`. */
export function numbered(sql: string): string {
  let n = 0;
  return sql.replace(/\?/g, () => `$${++n}`);
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

  async transaction<T>(steps: Steps<T>): Promise<T> {
    const c = await this.pool.connect();
    try {
      await c.query("BEGIN");
      if (this.lockKey !== undefined) await c.query("SELECT pg_advisory_xact_lock($1)", [this.lockKey]);
      const out = await driveAsync(steps, (s) => execute(c, s));
      await c.query("COMMIT");
      return out;
    } catch (err) {
      await c.query("ROLLBACK").catch(() => undefined);
      throw err;
    } finally {
      c.release();
    }
  }
}
