// What a NATS client of callplane needs to connect: where, how it proves itself, what CA it trusts.
import { readFileSync } from "node:fs";
import { type NatsServiceRole } from "./permissions.js";
import { readRoleSeed } from "./credentials.js";
import { INBOX } from "./subjects.js";

// ---- what a client needs to connect

/** Everything a NATS client of callplane needs: where, how it proves itself, what CA it trusts. */
export interface NatsAccess {
  url: string;
  /** PEM of the CA that issued the server's certificate. */
  caPem: string;
  /** An nkey seed (services, nkey-mode workers) or a token read anew at every (re)connect. */
  auth: { nkeySeed: string } | { token: () => string };
  inboxPrefix: string;
}

/** The NatsAccess of one of callplane's services, as a main.ts builds it from the configuration. */
export function natsAccess(
  config: { nats: { url: string; tls: { caFile: string }; credentialsDir: string } },
  role: NatsServiceRole,
): NatsAccess {
  return serviceNatsAccess({
    url: config.nats.url,
    caFile: config.nats.tls.caFile,
    credentialsDir: config.nats.credentialsDir,
    role,
  });
}

/** The NatsAccess of one of callplane's services, from its key file and the stack CA. */
export function serviceNatsAccess(opts: {
  url: string;
  caFile: string;
  credentialsDir: string;
  role: NatsServiceRole;
}): NatsAccess {
  let caPem: string;
  try {
    caPem = readFileSync(opts.caFile, "utf8");
  } catch (err) {
    throw new Error(
      `cannot read the CA of the NATS server's certificate at ${opts.caFile} (nats.tls.caFile): ${(err as Error).message}`,
      { cause: err },
    );
  }
  return {
    url: opts.url,
    caPem,
    auth: { nkeySeed: readRoleSeed(opts.credentialsDir, opts.role) },
    inboxPrefix: INBOX.service(opts.role),
  };
}
