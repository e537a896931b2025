// What a client may know before it has a token: is there an admin token issuer to ask, and does
// this API keep secrets?
import { sendJson, type RequestContext, type Router } from "../../../lib/http/index.js";
import type { ApiDeps } from "./deps.js";

export function addInfoRoutes(router: Router, deps: ApiDeps): void {
  router.add("GET", "/v1/info", (ctx) => info(deps, ctx));
}

function info(deps: ApiDeps, { res }: RequestContext): void {
  const issuerOn = deps.auth.issuerTokensAccepted;
  const enabled = deps.adminIssuer?.enabled ?? issuerOn;
  sendJson(res, 200, {
    service: "callplane-api",
    adminIssuer: {
      enabled,
      gatewayEnabled: enabled && (deps.adminIssuer?.gatewayEnabled ?? true),
      tokensAccepted: issuerOn,
    },
    secrets: deps.secrets !== undefined,
  });
}
