// The console's audit log on PostgreSQL (the SQLite store keeps the same rows: sqlite.ts): appended
// once per action, listed newest first, and pruned to its bounds (api.audit).
import type { Query } from "../db/postgres.js";
import { AUDIT_INSERT, auditFromRow, auditParams, type AuditRow } from "./rows.js";
import type { Store } from "./types.js";

export function postgresAuditLog(q: Query): Pick<Store, "appendAudit" | "listAudit" | "pruneAudit"> {
  return {
    async appendAudit(e) {
      await q(AUDIT_INSERT, auditParams(e));
    },
    async listAudit({ limit, offset }) {
      const r = await q("SELECT * FROM audit_log ORDER BY at DESC, seq DESC LIMIT ? OFFSET ?", [
        limit,
        offset,
      ]);
      return (r.rows as AuditRow[]).map(auditFromRow);
    },
    async pruneAudit({ keepRows, before }) {
      const old = await q("DELETE FROM audit_log WHERE at < ?", [before]);
      const over = await q(
        "DELETE FROM audit_log WHERE seq IN (SELECT seq FROM audit_log ORDER BY at DESC, seq DESC OFFSET ?)",
        [keepRows],
      );
      return (old.rowCount ?? 0) + (over.rowCount ?? 0);
    },
  };
}
