// What a caller may do: the NVCF scopes, the internal scopes of callplane's own services, and the
// principal every service's authentication yields.
import { CallplaneError } from "../errors.js";

export const SCOPES = [
  "register_function",
  "list_functions",
  "list_functions_details",
  "deploy_function",
  "update_function",
  "update_secrets",
  "delete_function",
  "manage_telemetries",
  "manage_registry_credentials",
  "cluster-management",
  "list_cluster_groups",
  "invoke_function",
  "queue_details",
  "authorize_clients",
] as const;
export type Scope = (typeof SCOPES)[number];

/**
 * What the issuer puts in an admin token (contract §5.4), plus the scopes needed to issue invoke
 * keys and list_cluster_groups (which GPUs and instance types a deployment may name).
 */
export const ADMIN_DEFAULT_SCOPES: readonly Scope[] = [
  "register_function",
  "list_functions",
  "list_functions_details",
  "deploy_function",
  "update_function",
  "update_secrets",
  "delete_function",
  "manage_telemetries",
  "manage_registry_credentials",
  "cluster-management",
  "list_cluster_groups",
  "invoke_function",
  "queue_details",
  "authorize_clients",
];

export const API_KEY_DEFAULT_SCOPES: readonly Scope[] = [
  "invoke_function",
  "list_functions",
  "queue_details",
  "list_functions_details",
];

/** Internal scopes held only by callplane's own services. */
export const SERVICE_SCOPES = {
  invocation: ["internal:invocation-auth", "internal:introspect"],
  compute: [
    "internal:deployments",
    "internal:instances",
    "internal:secrets",
    "internal:identities",
    "internal:clusters",
  ],
  "nats-auth-callout": ["internal:nats-auth", "internal:introspect"],
} as const satisfies Record<string, readonly string[]>;
export type ServiceName = keyof typeof SERVICE_SCOPES;

/** The `account` claim of an admin token for the whole plane (any account, and accounts themselves). */
export const PLANE_WIDE = "*";

/**
 * What a caller is. `account` is the NVCF account (`ncaId`) it acts in: an API key's own; an admin
 * token's claim, `PLANE_WIDE` for a token of the whole plane (which acts in the account a request
 * names, else the default one).
 */
export type Principal =
  | {
      kind: "admin";
      subject: string;
      tokenId: string;
      account: string;
      scopes: ReadonlySet<string>;
      expiresAt: Date;
    }
  | {
      kind: "apikey";
      subject: string;
      keyId: string;
      account: string;
      scopes: ReadonlySet<string>;
      expiresAt: Date;
    }
  | { kind: "service"; subject: ServiceName; scopes: ReadonlySet<string> };

export function requireScope(p: Principal, scope: string): void {
  if (!p.scopes.has(scope)) {
    throw new CallplaneError(
      "FORBIDDEN_SCOPE",
      `this ${p.kind === "apikey" ? "API key" : p.kind === "admin" ? "admin token" : "service token"} lacks the scope "${scope}", which this endpoint needs`,
      {
        extra: { requiredScope: scope },
      },
    );
  }
}
