// An instance's status from its pod, as the local backend reports its processes': STARTING until the
// pod runs and is Ready (its worker's readiness probe: the worker is up and its inference server
// healthy), ACTIVE then, ERRORED with a message saying why when it cannot get there by itself
// (unschedulable past compute.kubernetes.unschedulableSeconds, an image that cannot be pulled, a
// container that cannot be created or keeps crashing), and ended when the pod will never run again
// (Failed, Succeeded): the agent replaces it. Pure: the pod and the clock in, the verdict out.
import type { IContainerStatus, IPod } from "kubernetes-models/v1";

export type PodVerdict =
  | {
      status: "STARTING" | "ACTIVE" | "ERRORED";
      message?: string;
      /** Judge again at this time (ms since the epoch): a Pending pod turns unschedulable then. */
      recheckAt?: number;
    }
  | { ended: true; message: string };

const IMAGE_PULL = new Set(["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"]);
const CANNOT_CREATE = new Set(["CreateContainerConfigError", "CreateContainerError", "RunContainerError"]);

const clip = (s: string | undefined): string => (s ?? "").trim().slice(0, 600);
const detail = (reason: string | undefined, message: string | undefined): string =>
  [reason, clip(message)].filter(Boolean).join(": ");

/** The first container (init containers first) that is stuck, as an ERRORED verdict. */
function stuckContainer(pod: IPod): PodVerdict | undefined {
  const all: IContainerStatus[] = [
    ...(pod.status?.initContainerStatuses ?? []),
    ...(pod.status?.containerStatuses ?? []),
  ];
  for (const c of all) {
    const waiting = c.state?.waiting;
    const reason = waiting?.reason ?? "";
    if (IMAGE_PULL.has(reason))
      return {
        status: "ERRORED",
        message: `image pull failed: container ${c.name} (${c.image}): ${detail(reason, waiting?.message)}`,
      };
    if (CANNOT_CREATE.has(reason))
      return {
        status: "ERRORED",
        message: `container ${c.name} cannot be created: ${detail(reason, waiting?.message)}`,
      };
    if (reason === "CrashLoopBackOff") {
      const last = c.lastState?.terminated;
      const exit = last
        ? `; it last exited with code ${last.exitCode}${last.reason ? ` (${last.reason})` : ""}${last.message ? `: ${clip(last.message)}` : ""}`
        : "";
      return {
        status: "ERRORED",
        message: `container ${c.name} keeps crashing (restarted ${c.restartCount} times)${exit}`,
      };
    }
  }
  return undefined;
}

/**
 * The verdict on a pod now. `unschedulableMs` is how long a pod may wait for a node before it is
 * ERRORED (it stays, and turns STARTING or ACTIVE if a node takes it later).
 */
export function podVerdict(pod: IPod, now: number, unschedulableMs: number): PodVerdict {
  const phase = pod.status?.phase ?? "Pending";
  if (phase === "Failed")
    return {
      ended: true,
      message: `the pod failed${pod.status?.reason || pod.status?.message ? `: ${detail(pod.status?.reason, pod.status?.message)}` : ""}`,
    };
  if (phase === "Succeeded") return { ended: true, message: "the pod's containers exited (Succeeded)" };
  if (phase === "Unknown")
    return {
      status: "ERRORED",
      message: "the pod's state is Unknown: its node does not report (lost contact)",
    };

  const stuck = stuckContainer(pod);
  if (stuck) return stuck;

  const conditions = pod.status?.conditions ?? [];
  if (phase === "Pending" && !pod.spec?.nodeName) {
    const scheduled = conditions.find((c) => c.type === "PodScheduled");
    const refused = scheduled?.status === "False" ? scheduled : undefined;
    const since = Date.parse(
      refused?.lastTransitionTime ?? pod.metadata?.creationTimestamp ?? new Date(now).toISOString(),
    );
    const why = refused
      ? detail(refused.reason || "Unschedulable", refused.message)
      : "no node was assigned to it (is a scheduler running?)";
    const waited = now - since;
    if (waited >= unschedulableMs)
      return {
        status: "ERRORED",
        message: `unschedulable for ${Math.round(waited / 1000)}s: ${why}`,
      };
    return {
      status: "STARTING",
      message: refused ? `waiting for a node: ${why}` : undefined,
      recheckAt: since + unschedulableMs,
    };
  }

  const ready = conditions.find((c) => c.type === "Ready");
  if (phase === "Running" && ready?.status === "True") return { status: "ACTIVE" };
  if (phase === "Running")
    return {
      status: "STARTING",
      message: ready?.message ? clip(ready.message) : "waiting for the worker to be ready",
    };
  return { status: "STARTING" };
}
