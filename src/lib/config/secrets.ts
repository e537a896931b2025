// The secret store's section (the MEK keyring's provider, NEK limits and cache), and the MEK rules.
import { z } from "zod";
import { seconds, section } from "./fields.js";

export const secretsSection = section({
  mek: section({
    provider: z.enum(["file", "env", "plugin"]).default("file"),
    file: z.string().default(""),
    envVariable: z
      .string()
      .regex(/^[A-Z_][A-Z0-9_]*$/, "must be an environment variable name in upper case")
      .default("CALLPLANE_MEK_KEYRING"),
    plugin: z.string().default(""),
    refreshSeconds: seconds(30, 3600),
    rotationGraceSeconds: seconds(60, 7 * 86_400),
  }),
  nek: section({
    maxEncryptions: z.number().int().min(1).max(4_294_967_295).default(1_000_000_000),
  }),
  nekCache: section({
    maxEntries: z.number().int().min(1).max(1_000_000).default(1000),
    ttlSeconds: seconds(300, 86_400),
    outageSeconds: z.number().min(0).max(86_400).default(600),
  }),
});

export type SecretsConfig = z.output<typeof secretsSection>;

/** A rotation grace long enough for every replica to reload, and a plugin named when it is the provider. */
export function mekProblems(c: { secrets: SecretsConfig }): string[] {
  const p: string[] = [];
  const mek = c.secrets.mek;
  if (mek.rotationGraceSeconds < 2 * mek.refreshSeconds) {
    p.push(
      `secrets.mek.rotationGraceSeconds (${mek.rotationGraceSeconds}) is less than twice secrets.mek.refreshSeconds (${mek.refreshSeconds}): ` +
        "a new MEK could be promoted before every API replica has reloaded its keys, and one replica could write NEKs another cannot read. " +
        `Raise secrets.mek.rotationGraceSeconds to at least ${2 * mek.refreshSeconds}, or lower secrets.mek.refreshSeconds`,
    );
  }
  if (mek.provider === "plugin" && !mek.plugin) {
    p.push("secrets.mek.provider is plugin but secrets.mek.plugin is empty: name the plugin module's file");
  }
  return p;
}
