// What a compute agent under test hands its instances: the stack's defaults for a test (short
// grace and restart backoff), with the NATS server, its CA and the data folder the test gives, and
// whatever a test needs otherwise.
import type { BackendFilled, InstanceEnvironment } from "../../src/services/compute/deployment.js";

type TestInstanceEnvironment = Omit<InstanceEnvironment, BackendFilled>;

export function testInstanceEnv(
  o: { natsUrl: string; natsCaPem: string; dataDir: string },
  overrides: Partial<TestInstanceEnvironment> = {},
): TestInstanceEnvironment {
  return {
    region: "test",
    serviceDomain: "nvcf.svc.cluster.local",
    keepAliveSeconds: 10,
    inferenceIdleSeconds: 300,
    ackWaitSeconds: 30,
    streamMaxMessages: 1000,
    streamMaxMessageBytes: 1024 * 1024,
    streamReplicas: 1,
    stopGraceMs: 5000,
    restart: { initialMs: 300, maxMs: 1000 },
    logLevel: "info",
    workerExtraEnv: {},
    ...o,
    ...overrides,
  };
}
