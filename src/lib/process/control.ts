// The typed control channel between the stack (or compute agent) and the processes it supervises:
// JSON messages over Node's IPC channel, validated on receipt, so a child that says something
// unexpected is reported instead of misread.
import { z } from "zod";

export const childMessageSchema = z.discriminatedUnion("type", [
  z.object({
    type: z.literal("ready"),
    service: z.string(),
    urls: z.record(z.string(), z.string()).default({}),
  }),
  z.object({ type: z.literal("failed"), service: z.string(), code: z.string(), message: z.string() }),
  z.object({
    type: z.literal("status"),
    service: z.string(),
    state: z.string(),
    detail: z.string().optional(),
  }),
]);
export type ChildMessage = z.infer<typeof childMessageSchema>;

export const parentMessageSchema = z.discriminatedUnion("type", [
  z.object({
    type: z.literal("shutdown"),
    graceMs: z.number().int().nonnegative(),
    /**
     * false: skip the drain delay (a whole stack stopping: no balancer to notice, no replica to
     * take over). A replica stopped alone drains in full.
     */
    drainDelay: z.boolean().optional(),
  }),
]);
export type ParentMessage = z.infer<typeof parentMessageSchema>;

export function sendToParent(msg: ChildMessage): void {
  if (process.send && process.connected) process.send(msg);
}

export function parseChildMessage(raw: unknown): ChildMessage | { invalid: string } {
  const r = childMessageSchema.safeParse(raw);
  return r.success
    ? r.data
    : { invalid: r.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ") };
}

export function parseParentMessage(raw: unknown): ParentMessage | undefined {
  const r = parentMessageSchema.safeParse(raw);
  return r.success ? r.data : undefined;
}
