// The auth section: where the admin signing key, the service tokens and the worker identity key are.
import { z } from "zod";
import { section } from "./fields.js";

export const authSection = section({
  adminSigningKeyFile: z.string().default(""),
  adminPublicKeyFile: z.string().default(""),
  serviceTokenDir: z.string().default(""),
  workerIdentityKeyFile: z.string().default(""),
});

export type AuthConfig = z.output<typeof authSection>;
