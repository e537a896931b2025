// The instance types a cluster offers: what a deployment names and what it gets. A backend says
// what it offers (backend.ts offerInstanceTypes), the agent registers that with the API
// (instance-type-registration.ts, through api-client.ts), and the API refuses deployments naming a
// type no cluster has.

/** One instance type: what a deployment names (gpu, instanceType) and how many GPUs it gets. */
export interface InstanceTypeOffer {
  name: string;
  gpu: string;
  gpuCount: number;
}

/** The local backend's one type: a CPU instance on the agent's machine. */
export const LOCAL_INSTANCE_TYPE: InstanceTypeOffer = { name: "local.cpu", gpu: "local", gpuCount: 0 };
