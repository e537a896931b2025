// Request bodies of the control-plane API, as the NVCF contract shapes them (§5.1 to §5.4).
// Unknown fields are refused; fields of the NVCF contract that callplane does not implement are
// refused by name, so nothing a client sends is silently ignored.
import { z } from "zod";
import { CallplaneError } from "../../lib/errors.js";
import { SCOPES } from "../../lib/identity/index.js";

const NOT_SUPPORTED = [
  "models",
  "helmChart",
  "helmChartServiceName",
  "resources",
  "rateLimit",
  "llmInvocationConfig",
  "telemetries",
] as const;

// C0 controls, DEL, C1 controls and the bidirectional-formatting marks and controls: stored in a
// name, description or tag they would move a terminal's cursor, recolour it, or show text in
// another order than it is stored (a "Trojan Source" name). Lone surrogates are no text at all.
const UNSAFE_CHARACTER =
  // eslint-disable-next-line no-control-regex -- matching control characters is the point
  /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** The first character of `text` that display text must not hold, and its position (from 1, in characters). */
export function unsafeCharacter(text: string): { codePoint: string; position: number } | undefined {
  if (!UNSAFE_CHARACTER.test(text)) return undefined;
  let position = 0;
  for (const ch of text) {
    position++;
    if (UNSAFE_CHARACTER.test(ch)) {
      const codePoint = `U+${ch.codePointAt(0)!.toString(16).toUpperCase().padStart(4, "0")}`;
      return { codePoint, position };
    }
  }
  return undefined;
}

/**
 * A string shown to people (a name, a description, a tag): no control characters at all (so no
 * newlines or tabs either), no bidirectional formatting, no lone surrogates. Other Unicode, such
 * as "café 東京 😀", is text like any other. Chain limits on it: `safeText.min(1).max(64)`.
 */
export const safeText = z.string().superRefine((text, ctx) => {
  const bad = unsafeCharacter(text);
  if (bad)
    ctx.addIssue({
      code: "custom",
      message: `must not contain control or bidirectional-formatting characters (${bad.codePoint} at position ${bad.position})`,
    });
});

const isoDuration = z
  .string()
  .regex(/^PT(?=\d)(\d+H)?(\d+M)?(\d+(\.\d+)?S)?$/, "must be an ISO-8601 duration such as PT10S");

export const healthSchema = z.strictObject({
  protocol: z.enum(["HTTP", "gRPC"]).default("HTTP"),
  uri: safeText.startsWith("/", "must be a path beginning with /").max(1024).default("/v2/health/ready"),
  port: z.number().int().min(1).max(65535).optional(),
  timeout: isoDuration.default("PT10S"),
  expectedStatusCode: z.number().int().min(100).max(599).default(200),
});

const containerEnvironment = z
  .array(
    z.strictObject({
      key: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "must be an environment variable name"),
      value: z.string().max(32_768),
    }),
  )
  .max(256);

const functionFields = {
  inferenceUrl: safeText
    .startsWith("/", "must be the path on the inference server, beginning with / (for example /echo)")
    .max(2048),
  inferencePort: z.number().int().min(1).max(65535).default(8000),
  health: healthSchema.optional(),
  healthUri: safeText.startsWith("/", "must be a path beginning with /").optional(),
  containerImage: safeText.min(1).max(512),
  containerArgs: z.string().max(8192).optional(),
  containerEnvironment: containerEnvironment.default([]),
  tags: z.array(safeText.min(1).max(128)).max(64).default([]),
  description: safeText.max(1024).optional(),
  functionType: z.enum(["DEFAULT", "STREAMING", "LLM"]).default("DEFAULT"),
  apiBodyFormat: z.enum(["CUSTOM", "PREDICT_V2"]).default("CUSTOM"),
};

export const SECRET_NAME = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/;
export const MAX_SECRET_VALUE_CHARS = 32_768;

const secretValue = z.union([z.string(), z.record(z.string(), z.unknown())], {
  message: "must be a string or a JSON object",
});

/** One NVCF secret, `{name, value}`; the messages never quote a value. */
export const secretEntry = z.strictObject({
  name: z
    .string({ message: "must be a string" })
    .min(1, "must not be empty")
    .max(48, "must be at most 48 characters")
    .regex(SECRET_NAME, "must start with a letter or digit and hold only letters, digits, _ . and -"),
  value: secretValue.superRefine((v, ctx) => {
    const text = typeof v === "string" ? v : JSON.stringify(v);
    if (text.trim().length === 0) ctx.addIssue({ code: "custom", message: "must not be empty" });
    if (text.length > MAX_SECRET_VALUE_CHARS)
      ctx.addIssue({ code: "custom", message: `must be at most ${MAX_SECRET_VALUE_CHARS} characters` });
  }),
});

export const secretList = z
  .array(secretEntry)
  .max(128, "at most 128 secrets at once")
  .superRefine((list, ctx) => {
    const seen = new Set<string>();
    for (const [i, s] of list.entries()) {
      if (seen.has(s.name))
        ctx.addIssue({ code: "custom", path: [i, "name"], message: `"${s.name}" is given twice` });
      seen.add(s.name);
    }
  });

export const functionName = z
  .string()
  .min(1, "must not be empty")
  .max(128, "must be at most 128 characters")
  .regex(
    /^[a-zA-Z0-9][a-zA-Z0-9_-]*$/,
    "must start with a letter or digit and hold only letters, digits, _ and -",
  );

export const createFunctionSchema = z.strictObject({
  name: functionName,
  ...functionFields,
  secrets: secretList.optional(),
});
export type CreateFunctionBody = z.infer<typeof createFunctionSchema>;

export const updateFunctionSchema = z.strictObject({
  name: functionName.optional(),
  inferenceUrl: functionFields.inferenceUrl.optional(),
  inferencePort: z.number().int().min(1).max(65535).optional(),
  health: healthSchema.optional(),
  containerImage: functionFields.containerImage.optional(),
  containerArgs: functionFields.containerArgs,
  // not functionFields.containerEnvironment: its default would replace the stored list on every PUT
  containerEnvironment: containerEnvironment.optional(),
  tags: z.array(safeText.min(1).max(128)).max(64).optional(),
  description: functionFields.description,
});

const deploymentSpecSchema = z
  .strictObject({
    gpuSpecificationId: safeText.max(128).optional(),
    gpu: safeText.min(1).max(128),
    backend: safeText.max(128).optional(),
    instanceType: safeText.min(1).max(128),
    minInstances: z.number().int().min(0).max(1000),
    maxInstances: z.number().int().min(1).max(1000),
    maxRequestConcurrency: z.number().int().min(1).max(1024).default(1),
    availabilityZones: z.array(safeText).optional(),
    regions: z.array(safeText).optional(),
    clusters: z.array(safeText).optional(),
    attributes: z.array(safeText).optional(),
    configuration: z.unknown().optional(),
  })
  .superRefine((s, ctx) => {
    if (s.minInstances > s.maxInstances) {
      ctx.addIssue({
        code: "custom",
        path: ["minInstances"],
        message: `minInstances (${s.minInstances}) is larger than maxInstances (${s.maxInstances})`,
      });
    }
  });

export const deploymentSchema = z.strictObject({
  deploymentSpecifications: z
    .array(deploymentSpecSchema)
    .min(1, "must hold at least one specification")
    .max(16),
});

// ---- the instance types a cluster offers (registered by its compute agent)
/** A cluster's id, as compute.workerIdentity.clusterId spells one. */
export const CLUSTER_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
export const MAX_INSTANCE_TYPES = 256;

export const instanceTypesSchema = z.strictObject({
  backend: z.enum(["local", "kubernetes"]),
  instanceTypes: z
    .array(
      z.strictObject({
        // the same bounds as a deployment's gpu and instanceType, which must match them
        name: safeText.min(1).max(128),
        gpu: safeText.min(1).max(128),
        gpuCount: z.number().int().min(0).max(64),
      }),
    )
    .max(MAX_INSTANCE_TYPES, `at most ${MAX_INSTANCE_TYPES} instance types`)
    .superRefine((list, ctx) => {
      const seen = new Set<string>();
      for (const [i, t] of list.entries()) {
        if (seen.has(t.name))
          ctx.addIssue({ code: "custom", path: [i, "name"], message: `"${t.name}" is given twice` });
        seen.add(t.name);
      }
    }),
});
export type InstanceTypesBody = z.infer<typeof instanceTypesSchema>;

export const createKeySchema = z.strictObject({
  description: safeText.max(1024).default(""),
  expires_at: z.iso
    .datetime({ offset: true, message: "must be an RFC 3339 time such as 2027-01-01T00:00:00Z" })
    .optional(),
  authorizations: z
    .strictObject({
      policies: z
        .array(
          z.strictObject({
            scopes: z.array(z.enum(SCOPES, { message: `must be one of: ${SCOPES.join(", ")}` })).min(1),
            // the type is checked by the API itself, which answers POLICY_NOT_ENFORCEABLE
            resources: z
              .array(z.strictObject({ id: z.string().max(64), type: z.string().max(64) }))
              .min(1)
              .max(256)
              .optional(),
            // descriptive fields of NVCF's policies: callplane is the only audience and product
            product: z.literal("nv-cloud-functions").optional(),
            aud: z.literal("callplane-api").optional(),
            auds: z.array(z.literal("callplane-api")).optional(),
          }),
        )
        .min(1)
        .max(64),
    })
    .optional(),
  audience_service_ids: z.array(z.literal("callplane-api")).optional(),
});
export type CreateKeyBody = z.infer<typeof createKeySchema>;

// ---- secrets (contract §5.3) and the admin endpoints that rotate their keys
export const updateSecretsSchema = z.strictObject({
  secrets: secretList.refine((l) => l.length > 0, "must hold at least one secret"),
});

export const rotateMekSchema = z.strictObject({ keyId: safeText.min(1).max(255).optional() });
export const rotateNekSchema = z.strictObject({
  functionId: z
    .string()
    .regex(
      /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i,
      "must be a function id (a UUID)",
    )
    .optional(),
});

/** Parses a body against a schema, turning every problem into one VALIDATION_FAILED that names each field. */
export function parseBody<T extends z.ZodType>(schema: T, body: unknown): z.infer<T> {
  if (body === undefined) throw new CallplaneError("VALIDATION_FAILED", "the request needs a JSON body");
  if (body && typeof body === "object" && !Array.isArray(body)) {
    const unsupported = NOT_SUPPORTED.filter((k) => k in body);
    if (unsupported.length) {
      throw new CallplaneError(
        "VALIDATION_FAILED",
        `${unsupported.join(", ")}: part of the NVCF contract that callplane does not support yet; remove ${unsupported.length > 1 ? "them" : "it"}`,
        { extra: { errors: unsupported.map((field) => ({ field, message: "not supported by callplane" })) } },
      );
    }
  }
  const r = schema.safeParse(body);
  if (r.success) return r.data;
  const errors: Array<{ field: string; message: string }> = [];
  for (const issue of r.error.issues) {
    const base = issue.path.map(String).join(".");
    if (issue.code === "unrecognized_keys") {
      for (const k of issue.keys) errors.push({ field: base ? `${base}.${k}` : k, message: "unknown field" });
    } else {
      errors.push({ field: base || "(body)", message: issue.message });
    }
  }
  throw new CallplaneError("VALIDATION_FAILED", errors.map((e) => `${e.field}: ${e.message}`).join("; "), {
    extra: { errors },
  });
}
