// Request bodies for the API that many tests send: a function and a deployment of it.

export const sampleFunction = (name: string, extra: Record<string, unknown> = {}) => ({
  name,
  inferenceUrl: "/echo",
  inferencePort: 8000,
  containerImage: "local/echo",
  health: { protocol: "HTTP", uri: "/health", port: 8000, timeout: "PT10S", expectedStatusCode: 200 },
  ...extra,
});

export const sampleDeployment = (min = 1, max = 2, concurrency = 4) => ({
  deploymentSpecifications: [
    {
      gpu: "local",
      instanceType: "local.cpu",
      minInstances: min,
      maxInstances: max,
      maxRequestConcurrency: concurrency,
    },
  ],
});
