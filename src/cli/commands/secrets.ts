// `callplane secrets status|rotate-mek|rotate-nek|mek-generate`: the keys that protect secrets.
// A MEK rotation runs in the API (every replica takes part); this command starts it and follows
// it to the end, one line per step. Stopping the command does not stop the rotation: running it
// again follows the one under way.
import type { Command } from "commander";
import { Api } from "../client.js";
import { CliError } from "../errors.js";
import { resolveFunction } from "../functions.js";
import { note, printFields, printJson, printTable, say } from "../output.js";
import { integer } from "../parse.js";
import { settingsFor } from "../settings.js";

interface KeyStatus {
  replicaId: string;
  provider: {
    name: string;
    keyIds: string[];
    canCreateKeys: boolean;
    canDestroyKeys: boolean;
    lastRefresh: { ok: boolean; at?: string; error?: string };
  };
  primaryKid: string | null;
  meks: Array<{ kid: string; state: string; addedAt?: string; neks: number; inProvider: boolean }>;
  rotation: null | {
    id: string;
    phase: "distributing" | "rewrapping" | "done" | "aborted";
    fromKid: string;
    toKid: string;
    rolledBack: boolean;
    startedAt?: string;
    promoteAfter?: string;
    promotedAt?: string;
    finishedAt?: string;
    neksAtStart: number;
    neksLeft: number;
    keyDestroyed: boolean;
    waitingFor: string[];
    blockedBy?: string[];
  };
  replicas: Array<{
    id: string;
    keyIds: string[];
    primaryKid: string | null;
    seenAt?: string;
    live: boolean;
  }>;
  neks: { total: number; retiring: number; highestEncryptions: number; maxEncryptions: number };
  cache: { entries: number; maxEntries: number };
  settings: { refreshSeconds: number; rotationGraceSeconds: number };
}

const open = (r: KeyStatus["rotation"]) =>
  r !== null && (r.phase === "distributing" || r.phase === "rewrapping");

function describe(r: NonNullable<KeyStatus["rotation"]>): string {
  const arrow = `${r.fromKid} -> ${r.toKid}${r.rolledBack ? " (rolling back)" : ""}`;
  switch (r.phase) {
    case "distributing":
      return `distributing ${arrow}: the new MEK is decrypt-only${r.waitingFor.length ? `; waiting for ${r.waitingFor.join("; ")}` : "; promoting"}`;
    case "rewrapping": {
      const total = Math.max(r.neksAtStart, r.neksLeft);
      return `rewrapping ${arrow}: the new MEK is primary; ${total - r.neksLeft}/${total} NEKs re-wrapped${r.waitingFor.length ? `; waiting for ${r.waitingFor.join("; ")}` : ""}${r.blockedBy?.length ? `; BLOCKED by ${r.blockedBy.join("; ")}` : ""}`;
    }
    case "done":
      return `done ${arrow}: ${r.fromKid} is retired${r.keyDestroyed ? " and removed from the provider" : "; remove it from every replica's keyring yourself (this provider cannot)"}`;
    case "aborted":
      return `aborted: ${r.toKid} was dropped before it was used; ${r.fromKid} stays primary`;
  }
}

function printStatus(st: KeyStatus): void {
  printFields([
    [
      "provider",
      `${st.provider.name} (keys: ${st.provider.keyIds.join(", ") || "none"})${st.provider.lastRefresh.ok ? "" : ` LAST REFRESH FAILED: ${st.provider.lastRefresh.error ?? ""}`}`,
    ],
    ["primary MEK", st.primaryKid ?? "none"],
    [
      "NEKs",
      `${st.neks.total} (${st.neks.retiring} being emptied by a NEK rotation; most encryptions on one: ${st.neks.highestEncryptions} of ${st.neks.maxEncryptions})`,
    ],
    ["rotation", st.rotation ? describe(st.rotation) : "none yet"],
    [
      "grace period",
      `${st.settings.rotationGraceSeconds} s (replicas reload keys every ${st.settings.refreshSeconds} s)`,
    ],
  ]);
  console.log("");
  printTable(
    ["MEK", "STATE", "NEKS", "IN PROVIDER", "ADDED"],
    st.meks.map((m) => [m.kid, m.state, String(m.neks), m.inProvider ? "yes" : "no", m.addedAt ?? ""]),
  );
  console.log("");
  printTable(
    ["API REPLICA", "LIVE", "PRIMARY", "KEYS", "SEEN"],
    st.replicas.map((r) => [
      r.id,
      r.live ? "yes" : "no",
      r.primaryKid ?? "-",
      r.keyIds.join(","),
      r.seenAt ?? "",
    ]),
  );
}

/** Polls the key status until the rotation ends, printing each change on stderr. */
async function follow(api: Api, intervalMs: number, first: KeyStatus): Promise<KeyStatus> {
  let st = first;
  let last = "";
  let printed = 0;
  let lingering = 0;
  for (;;) {
    const line = st.rotation ? describe(st.rotation) : "no rotation";
    // a new line when something other than a countdown changed, and at least every 15 s
    const shape = line.replace(/\d+/g, "#");
    if (shape !== last || Date.now() - printed >= 15_000) {
      note(`[${new Date().toISOString().slice(11, 19)}] ${line}`);
      last = shape;
      printed = Date.now();
    }
    // retired, the old key is removed from the provider just after: give that a few looks
    const removing = st.rotation?.phase === "done" && st.provider.canDestroyKeys && !st.rotation.keyDestroyed;
    if (!open(st.rotation) && !(removing && lingering++ < 5)) return st;
    await new Promise((r) => setTimeout(r, intervalMs));
    st = await api.call<KeyStatus>("GET", "/v1/admin/secrets/keys");
  }
}

export function registerSecrets(program: Command): void {
  const secrets = program
    .command("secrets")
    .description("the keys that protect secrets: status, MEK and NEK rotation (admin token)");

  secrets
    .command("status")
    .description("show the MEKs, the rotation under way or last done, the NEKs and the API replicas")
    .action(async (_opts: unknown, cmd: Command) => {
      const s = settingsFor(cmd);
      const st = await new Api(s).call<KeyStatus>("GET", "/v1/admin/secrets/keys");
      if (s.json) return printJson(st);
      printStatus(st);
    });

  secrets
    .command("rotate-mek")
    .description("rotate the master encryption key without an outage, and follow it to the end")
    .option(
      "--key-id <kid>",
      "use this key, already added to every replica's provider (env and plugin providers)",
    )
    .option("--no-wait", "start (or abort) and return; follow later with `callplane secrets rotate-mek`")
    .option(
      "--abort",
      "abort the rotation under way: before promotion the new key is dropped; after, NEKs go back to the old key",
    )
    .option("--interval <seconds>", "how often to check progress", integer(1, 60), 2)
    .addHelpText(
      "after",
      `
Steps (docs/operations.md, "Rotating the MEK"): the new MEK is added decrypt-only; after the grace
period (secrets.mek.rotationGraceSeconds) and once every API replica holds it, it is promoted;
every NEK is re-wrapped in the background; the old MEK is retired once nothing uses it. A rotation
already under way is followed, not restarted. Ctrl-C stops following; the rotation goes on.`,
    )
    .action(
      async (opts: { keyId?: string; wait: boolean; abort?: boolean; interval: number }, cmd: Command) => {
        const s = settingsFor(cmd);
        const api = new Api(s);
        let st = await api.call<KeyStatus>("GET", "/v1/admin/secrets/keys");
        if (opts.abort) {
          st = await api.call<KeyStatus>("POST", "/v1/admin/secrets/mek/rotate/abort");
          note(
            st.rotation?.phase === "aborted"
              ? `aborted: ${st.rotation.toKid} is dropped`
              : `rolling back: ${st.rotation?.toKid ?? "the previous MEK"} is primary again; NEKs are re-wrapped back to it`,
          );
        } else if (open(st.rotation)) {
          if (opts.keyId !== undefined && opts.keyId !== st.rotation!.toKid)
            throw new CliError(
              `a rotation to ${st.rotation!.toKid} is under way; --key-id ${opts.keyId} cannot start another`,
              "ROTATION_IN_PROGRESS",
              { hint: "follow it with `callplane secrets rotate-mek`, or abort it with --abort" },
            );
          note(
            `a rotation to ${st.rotation!.toKid} is under way (started ${st.rotation!.startedAt ?? "?"}); following it`,
          );
        } else {
          st = await api.call<KeyStatus>(
            "POST",
            "/v1/admin/secrets/mek/rotate",
            opts.keyId ? { keyId: opts.keyId } : {},
          );
          note(
            `started: ${st.rotation!.toKid} replaces ${st.rotation!.fromKid}; promotion not before ${st.rotation!.promoteAfter ?? "?"} (Ctrl-C stops following, not the rotation)`,
          );
        }
        if (opts.wait) st = await follow(api, opts.interval * 1000, st);
        if (s.json) return printJson(st);
        if (st.rotation) say(describe(st.rotation));
      },
    );

  secrets
    .command("rotate-nek")
    .description("give a function (or every function) a new NEK; its secrets move to it in the background")
    .argument("[function]", "function id or name (default: every function with secrets)")
    .action(async (ref: string | undefined, _opts: unknown, cmd: Command) => {
      const s = settingsFor(cmd);
      const api = new Api(s);
      const body = ref ? { functionId: (await resolveFunction(api, ref)).id } : {};
      const r = await api.call<{ rotated: string[] }>("POST", "/v1/admin/secrets/nek/rotate", body);
      if (s.json) return printJson(r);
      say(
        r.rotated.length
          ? `new NEK for ${r.rotated.join(", ")}; secrets move over in the background (\`callplane secrets status\` shows NEKs being emptied)`
          : "no function has secrets yet: nothing to rotate",
      );
    });

  secrets
    .command("mek-generate")
    .description("print a new MEK keyring entry (or a whole keyring) for the env or file provider")
    .option("--keyring", "print a whole keyring holding only the new key")
    .addHelpText(
      "after",
      `
The output is key material: redirect it into your secret manager, never into a shared log. With the
env provider, add the entry to the keyring in the environment of every API replica, restart them,
then run \`callplane secrets rotate-mek --key-id <kid>\`.`,
    )
    .action(async (opts: { keyring?: boolean }) => {
      const { KEYRING_FORMAT, newKeyringEntry } = await import("../../lib/secrets/index.js");
      const entry = newKeyringEntry();
      printJson(opts.keyring ? { format: KEYRING_FORMAT, keys: [entry] } : entry);
      note(`kid ${entry.kid}`);
    });
}
