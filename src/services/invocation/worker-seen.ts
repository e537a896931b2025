// Which worker has a request, as far as the replica that holds it can tell, for the operator
// console (plane/console-wire.ts: HeldState, WorkerSeen). A replica hears from a worker only when
// the worker contacts it: GET request-attach (the rest of a body too large for the work message),
// POST request-attach or an answer over NATS (the answer), the ack of a status poll. What the
// contact carried is kept on the request as it came (a few references, nothing parsed) and read
// only when the console asks; the ring of ended requests keeps it too (ended-requests.ts).
import type { IncomingMessage } from "node:http";
import { WORKER_INSTANCE_HEADER } from "../../lib/contract.js";
import { INBOX } from "../../lib/nats/index.js";
import type { HeldState, WorkerSeen } from "../../plane/console-wire.js";

/** What a worker's last contact about a request carried, unparsed. */
export interface WorkerContact {
  /** An HTTP callback's WORKER_INSTANCE_HEADER, or a status poll's ack body: the worker's own word. */
  named?: string | string[] | undefined;
  /** An HTTP callback's X-Forwarded-For (set by the callback proxy, or by a relaying replica). */
  forwardedFor?: string | string[] | undefined;
  /** The address an HTTP callback's connection came from. */
  remote?: string | undefined;
  /** The reply subject of an answer over NATS: the worker's inbox, which names its instance. */
  inbox?: string | undefined;
}

/** An HTTP callback (request-attach, either method, relayed or not). */
export function callbackContact(req: IncomingMessage): WorkerContact {
  return {
    named: req.headers[WORKER_INSTANCE_HEADER],
    forwardedFor: req.headers["x-forwarded-for"],
    remote: req.socket.remoteAddress,
  };
}

/** Where a held request (not done) is: a worker that called back and has not begun its answer has it. */
export function heldState(p: {
  state: "queued" | "responding" | "done";
  worker?: WorkerContact | undefined;
}): HeldState {
  if (p.state === "responding") return "responding";
  return p.worker ? "with-worker" : "queued";
}

const INSTANCE_ID = /^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$/;
const WORKER_INBOXES = [INBOX.tokenWorker(""), INBOX.nkeyWorker("")];

/** What the console shows of a contact; undefined when it said nothing usable. */
export function describeWorker(c: WorkerContact | undefined): WorkerSeen | undefined {
  if (!c) return undefined;
  const seen: WorkerSeen = {};
  const instanceId = instanceOfInbox(c.inbox) ?? first(c.named);
  if (instanceId !== undefined && INSTANCE_ID.test(instanceId)) seen.instanceId = instanceId;
  const address = first(c.forwardedFor)?.split(",")[0]?.trim() || c.remote;
  if (address) seen.address = address.startsWith("::ffff:") ? address.slice(7) : address.slice(0, 64);
  return seen.instanceId !== undefined || seen.address !== undefined ? seen : undefined;
}

/**
 * `<worker inbox prefix>.<instance id>.<inbox>.<n>` (lib/nats/replies.ts adds the last two): the
 * instance id between. A token worker's prefix is bound to its instance by NATS; an nkey worker's
 * is its own word (or its process id, without INSTANCE_ID).
 */
function instanceOfInbox(inbox: string | undefined): string | undefined {
  const prefix = inbox && WORKER_INBOXES.find((p) => inbox.startsWith(p));
  if (!prefix) return undefined;
  const tokens = inbox.slice(prefix.length).split(".");
  return tokens.length > 2 ? tokens.slice(0, -2).join(".") : undefined;
}

function first(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}
