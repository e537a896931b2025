// The testkit: helpers that start real parts (nats-server, services on 127.0.0.1:0, child processes)
// and always stop them when the test ends. This file only re-exports its modules, one per kind of
// thing started; tests may import a module directly:
//   paths.ts     where the repository and dist/ are
//   scope.ts     temporary folders, removeDir, Scope and reverseScope (cleanups in reverse)
//   nats.ts      startNats (one nats-server as the stack runs it), startTestCallout
//   services.ts  startApi (the API in this process), startIssuer (the admin token issuer, with its operator credential)
//   client.ts    HTTP clients: call (status, headers, JSON body), problemOf, waitFor, bearer
//   cli.ts       runCli (the built CLI as a child process)
//   samples.ts   sampleFunction, sampleDeployment (API request bodies)
// and, not re-exported here: tls.ts (certificates), inference.ts (example inference servers),
// plane.ts (a whole plane in this process), processes.ts (services as child processes),
// two-networks.ts (the plane split across a network namespace), grpc.ts, trust.ts, netns.ts,
// nats-cluster.ts, postgres.ts, hosts.ts, proc.ts, kube-apiserver.ts (etcd + kube-apiserver 1.20,
// optionally kube-controller-manager, on loopback), stack.ts (the whole local stack, `npm start`'s,
// as a user runs it).
export { distRoot, repoRoot } from "./paths.js";
export { removeDir, tmpDir } from "./scope.js";
export { startNats, startTestCallout, type Nats } from "./nats.js";
export {
  mintAdminToken,
  startApi,
  startIssuer,
  type ApiFixture,
  type StartApiOptions,
  type TestIssuer,
} from "./services.js";
export { call, type JsonResponse } from "./client.js";
export { CLI_CLEAN_ENV, runCli } from "./cli.js";
export { sampleDeployment, sampleFunction } from "./samples.js";
