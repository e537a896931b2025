// The pki section: where the stack's certificates and its CA are.
import { z } from "zod";
import { section } from "./fields.js";

export const pkiSection = section({
  dir: z.string().default(""),
  caCertFile: z.string().default(""),
  caKeyFile: z.string().default(""),
});
