// The global and log sections: the stack's region, service domain and data folder, the addresses
// workers are given in a split plane, and the log level.
import { z } from "zod";
import { dnsName, optionalUrl, section } from "./fields.js";

export const globalSection = section({
  region: z
    .string()
    .regex(/^[a-z0-9][a-z0-9-]*$/, "must be lower-case letters, digits and dashes")
    .default("local"),
  serviceDomain: dnsName.default("nvcf.svc.cluster.local"),
  dataDir: z.string().min(1).default(".callplane"),
  hosts: z
    .array(
      z.string().regex(/^(\*\.)?[a-z0-9]([a-z0-9.-]*[a-z0-9])?$/, "must be a lower-case DNS name, or *.name"),
    )
    .max(256)
    .default([]),
  workerEndpoints: section({
    invocationServiceURL: optionalUrl(["http", "https"]),
    invocationProxyURL: optionalUrl(["http", "https"]),
    grpcProxyWorkerConnectURL: optionalUrl(["http", "https"]),
  }),
});

export const logSection = section({
  level: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
});

export type GlobalConfig = z.output<typeof globalSection>;
