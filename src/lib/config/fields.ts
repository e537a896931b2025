// The field types the sections are built from: addresses, networks, URLs, DNS names, durations,
// and `section`, a strict object (unknown keys are errors) whose fields all default when it is absent.
import { z } from "zod";
import { parseCidr, parseHostPort } from "../net/index.js";

export const hostPort = z.string().refine(
  (v) => {
    try {
      parseHostPort(v);
      return true;
    } catch {
      return false;
    }
  },
  { message: "must be host:port, for example 127.0.0.1:8080" },
);
export const cidr = z.string().refine(
  (v) => {
    try {
      parseCidr(v);
      return true;
    } catch {
      return false;
    }
  },
  { message: "must be an IPv4 CIDR, for example 10.0.0.0/16" },
);
export const optionalUrl = (schemes: string[]) =>
  z
    .string()
    .default("")
    .refine(
      (v) => {
        if (v === "") return true;
        try {
          return schemes.includes(new URL(v).protocol.slice(0, -1));
        } catch {
          return false;
        }
      },
      { message: `must be empty or a URL with scheme ${schemes.join(" or ")}` },
    );
export const dnsName = z
  .string()
  .regex(
    /^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/,
    "must be a lower-case DNS name",
  );
export const seconds = (def: number, max = 86_400) => z.number().positive().max(max).default(def);
export const section = <T extends z.ZodRawShape>(shape: T) => z.strictObject(shape).prefault({} as never);
