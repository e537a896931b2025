// Everything that differs between SQLite and PostgreSQL in the data layer's SQL, in one place: the
// column types a migration asks for, how a table keeps its insertion order, how a list of values is
// bound, and how the catalog tells that a table exists. Every other statement is written once, with
// `?` placeholders, in SQL that both accept (the PostgreSQL runner numbers them: $1, $2, ...).

/** The column types of the migrations (MIGRATIONS in migrations.ts) that are not the same on both. */
export interface ColumnTypes {
  /** Bytes (wrapped keys, ciphertexts). */
  bytes: "BLOB" | "BYTEA";
  /** A 64-bit integer: millisecond times and counters. SQLite's INTEGER already is one. */
  int64: "INTEGER" | "BIGINT";
  /**
   * A flag, 0 or 1. Stays INTEGER on PostgreSQL too: that is how the first schemas stored flags,
   * and the queries write 0 and 1, which a PostgreSQL BOOLEAN would refuse.
   */
  flag: "INTEGER";
  /** An instant as ISO-8601 text (the store's created_at and the like): TEXT on both. */
  isoTime: "TEXT";
  /**
   * What a CREATE TABLE adds (after its last column) for a row order to break ties by: nothing on
   * SQLite, whose every table has a rowid already; an autoincrementing column on PostgreSQL.
   */
  insertionOrderColumn: "" | ", seq BIGSERIAL";
}

export interface Dialect {
  name: "sqlite" | "postgres";
  types: ColumnTypes;
  /** The column that numbers a table's rows in insertion order (see insertionOrderColumn). */
  insertionOrder: "rowid" | "seq";
  /** `column` is one of `values`: an SQL condition and its parameters. */
  anyOf(column: string, values: readonly string[]): { sql: string; params: unknown[] };
  /** ` AND column is none of values` (empty when there is nothing to leave out on SQLite). */
  andNoneOf(column: string, values: ReadonlySet<string>): { sql: string; params: unknown[] };
  /** A longer list than this is not bound value by value: the rows are read whole and filtered. */
  maxListParams: number;
  /** One row when the table named by the one parameter exists (in the current schema). */
  tableExistsSql: string;
}

const marks = (n: number) => Array.from({ length: n }, () => "?").join(", ");

export const SQLITE: Dialect = {
  name: "sqlite",
  types: { bytes: "BLOB", int64: "INTEGER", flag: "INTEGER", isoTime: "TEXT", insertionOrderColumn: "" },
  insertionOrder: "rowid",
  anyOf: (column, values) => ({ sql: `${column} IN (${marks(values.length)})`, params: [...values] }),
  andNoneOf: (column, values) =>
    values.size === 0
      ? { sql: "", params: [] }
      : { sql: ` AND ${column} NOT IN (${marks(values.size)})`, params: [...values] },
  // far below SQLite's limit on bound parameters, whichever build
  maxListParams: 500,
  tableExistsSql: "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
};

export const POSTGRES: Dialect = {
  name: "postgres",
  types: {
    bytes: "BYTEA",
    int64: "BIGINT",
    flag: "INTEGER",
    isoTime: "TEXT",
    insertionOrderColumn: ", seq BIGSERIAL",
  },
  insertionOrder: "seq",
  // one array parameter, however long the list
  anyOf: (column, values) => ({ sql: `${column} = ANY(?::text[])`, params: [[...values]] }),
  andNoneOf: (column, values) => ({ sql: ` AND NOT (${column} = ANY(?::text[]))`, params: [[...values]] }),
  maxListParams: Number.POSITIVE_INFINITY,
  tableExistsSql: "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = current_schema() AND tablename = ?",
};
