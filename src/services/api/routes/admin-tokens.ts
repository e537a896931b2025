// Revoking one admin token by its id (its `jti`, shown by `callplane init` and the issuer), before
// it expires: a plane-wide admin token revokes any; any admin token may revoke itself.
import { CallplaneError } from "../../../lib/errors.js";
import { PLANE_WIDE } from "../../../lib/identity/index.js";
import { sendJson, type RequestContext, type Router } from "../../../lib/http/index.js";
import type { ApiDeps } from "./deps.js";
import { UUID } from "./load.js";

export function addAdminTokenRoutes(router: Router, deps: ApiDeps): void {
  router.add("DELETE", "/v1/admin/tokens/:id", (ctx) => revokeAdminToken(deps, ctx));
}

async function revokeAdminToken(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const admin = await deps.auth.requireAdmin(req, "revoking an admin token");
  if (!UUID.test(params.id))
    throw new CallplaneError(
      "VALIDATION_FAILED",
      `token id: "${params.id.slice(0, 64)}" is not an admin token id (a UUID, the token's jti)`,
      { extra: { errors: [{ field: "id", message: "must be a UUID" }] } },
    );
  if (admin.account !== PLANE_WIDE && admin.tokenId !== params.id)
    throw new CallplaneError(
      "ACCOUNT_FORBIDDEN",
      "an account's admin token may revoke only itself; revoking another admin token needs a plane-wide one",
    );
  const at = new Date().toISOString();
  const first = await deps.store.revokeAdminToken(params.id, at);
  deps.logger.info({ tokenId: params.id, by: admin.tokenId }, "admin token revoked");
  sendJson(res, 200, { id: params.id, status: "REVOKED", revoked: first ? at : "earlier" });
}
