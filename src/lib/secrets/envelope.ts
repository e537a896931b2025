// The byte format of every ciphertext the secret store writes, version 1. Small on purpose, and
// exact: golden vectors in test/fixtures/ must open in every later version, so a change here is a
// new format version, never an edit.
//
//   offset  size  field
//   0       2     magic "CP" (0x43 0x50)
//   2       1     format version: 1
//   3       1     kind: 1 = a NEK wrapped by a MEK, 2 = a secret value encrypted by a NEK
//   4       1     length of the MEK key id (kind 1: 1..255; kind 2: 0, the NEK row names its MEK)
//   5       m     MEK key id (printable ASCII)
//   5+m     1     length of the NEK id (1..255)
//   6+m     n     NEK id (printable ASCII)
//   ---- end of the header ----
//   6+m+n   12    IV (random per encryption)            } the body; for kind 1 with a plugin
//   ...     c     AES-256-GCM ciphertext                } MEK provider, whatever bytes the
//   end-16  16    GCM tag (always 16 bytes)             } provider returns
//
// The additional authenticated data of every encryption is the header followed by a context that
// names where the ciphertext belongs (a JSON array of strings, see nekContext/secretContext), so a
// ciphertext copied to another row, secret, version or namespace fails to open, and no header field
// can be edited without the tag failing. The context itself is never stored. No compression (RFC
// 8725 §3.6): lengths of compressed plaintexts leak their content.
import { createCipheriv, createDecipheriv, randomBytes } from "node:crypto";

export const ENVELOPE_VERSION = 1;
export const KIND = { nek: 1, secret: 2 } as const;
export type EnvelopeKind = keyof typeof KIND;
export const IV_BYTES = 12;
export const TAG_BYTES = 16;
export const KEY_BYTES = 32;
const MAGIC = Buffer.from("CP", "latin1");
const ID = /^[\x21-\x7e]{1,255}$/;

export type EnvelopeProblem =
  | "not-an-envelope"
  | "unsupported-version"
  | "wrong-kind"
  | "malformed-header"
  | "too-short"
  | "tag-length"
  | "authentication-failed"
  | "bad-key";

/** Why a ciphertext cannot be opened. Never carries plaintext or key bytes. */
export class EnvelopeError extends Error {
  constructor(
    readonly problem: EnvelopeProblem,
    message: string,
  ) {
    super(message);
    this.name = "EnvelopeError";
  }
}

export interface EnvelopeHeader {
  version: number;
  kind: EnvelopeKind;
  /** The wrapping MEK (kind nek); empty for kind secret. */
  mekKid: string;
  nekId: string;
}

export interface ParsedEnvelope {
  header: EnvelopeHeader;
  /** The header bytes exactly as stored: the first part of the AAD. */
  headerBytes: Buffer;
  body: Buffer;
}

export function isValidKeyId(id: string): boolean {
  return ID.test(id);
}

export function encodeHeader(h: { kind: EnvelopeKind; mekKid?: string; nekId: string }): Buffer {
  const mek = h.kind === "nek" ? (h.mekKid ?? "") : "";
  if (h.kind === "nek" && !isValidKeyId(mek))
    throw new EnvelopeError("malformed-header", "a MEK key id must be 1-255 printable ASCII characters");
  if (h.kind === "secret" && h.mekKid)
    throw new EnvelopeError("malformed-header", "a secret's header names its NEK only");
  if (!isValidKeyId(h.nekId))
    throw new EnvelopeError("malformed-header", "a NEK id must be 1-255 printable ASCII characters");
  const mekBytes = Buffer.from(mek, "latin1");
  const nekBytes = Buffer.from(h.nekId, "latin1");
  return Buffer.concat([
    MAGIC,
    Buffer.from([ENVELOPE_VERSION, KIND[h.kind], mekBytes.length]),
    mekBytes,
    Buffer.from([nekBytes.length]),
    nekBytes,
  ]);
}

/** Splits a stored ciphertext into header and body; refuses anything that is not format 1. */
export function parseEnvelope(data: Uint8Array, want: EnvelopeKind): ParsedEnvelope {
  const buf = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  if (buf.length < 4 || buf[0] !== MAGIC[0] || buf[1] !== MAGIC[1])
    throw new EnvelopeError("not-an-envelope", "not a callplane ciphertext (no CP header)");
  if (buf[2] !== ENVELOPE_VERSION)
    throw new EnvelopeError(
      "unsupported-version",
      `ciphertext format version ${buf[2]} is not one this callplane reads (it reads ${ENVELOPE_VERSION})`,
    );
  const kind = buf[3] === KIND.nek ? "nek" : buf[3] === KIND.secret ? "secret" : undefined;
  if (kind === undefined) throw new EnvelopeError("malformed-header", `unknown ciphertext kind ${buf[3]}`);
  if (kind !== want)
    throw new EnvelopeError(
      "wrong-kind",
      `the ciphertext holds a ${kind === "nek" ? "NEK" : "secret value"}`,
    );
  let at = 4;
  const field = (what: string, allowEmpty: boolean): string => {
    if (at >= buf.length) throw new EnvelopeError("malformed-header", `the header ends before the ${what}`);
    const len = buf[at];
    at += 1;
    if (len === 0 && allowEmpty) return "";
    if (at + len > buf.length)
      throw new EnvelopeError("malformed-header", `the ${what} runs past the end of the ciphertext`);
    const text = buf.subarray(at, at + len).toString("latin1");
    at += len;
    if (!isValidKeyId(text)) throw new EnvelopeError("malformed-header", `the ${what} is not a key id`);
    return text;
  };
  const mekKid = field("MEK key id", kind === "secret");
  if (kind === "secret" && mekKid !== "")
    throw new EnvelopeError("malformed-header", "a secret's header must not name a MEK");
  const nekId = field("NEK id", false);
  return {
    header: { version: ENVELOPE_VERSION, kind, mekKid, nekId },
    headerBytes: buf.subarray(0, at),
    body: buf.subarray(at),
  };
}

/** The context a NEK wrap is bound to: the namespace it belongs to. */
export function nekContext(namespace: string): Buffer {
  return Buffer.from(JSON.stringify(["nek", namespace]), "utf8");
}

/** The context a secret value is bound to: namespace, function version and name. */
export function secretContext(namespace: string, versionId: string, name: string): Buffer {
  return Buffer.from(JSON.stringify(["secret", namespace, versionId, name]), "utf8");
}

export function aad(headerBytes: Buffer, context: Buffer): Buffer {
  return Buffer.concat([headerBytes, context]);
}

function checkKey(key: Buffer): void {
  if (key.length !== KEY_BYTES) throw new EnvelopeError("bad-key", `an AES-256 key has ${KEY_BYTES} bytes`);
}

/** AES-256-GCM with a fresh random 96-bit IV: returns IV | ciphertext | 16-byte tag. */
export function gcmSeal(key: Buffer, additionalData: Buffer, plaintext: Buffer): Buffer {
  checkKey(key);
  const iv = randomBytes(IV_BYTES);
  const c = createCipheriv("aes-256-gcm", key, iv, { authTagLength: TAG_BYTES });
  c.setAAD(additionalData);
  const ct = Buffer.concat([c.update(plaintext), c.final()]);
  return Buffer.concat([iv, ct, c.getAuthTag()]);
}

/**
 * Opens AES-256-GCM with an explicit tag. The tag must be exactly 16 bytes: Node 20 accepts a
 * truncated tag (4 bytes!) unless authTagLength is given (DEP0182), so both are enforced here.
 */
export function gcmOpenParts(
  key: Buffer,
  iv: Buffer,
  ciphertext: Buffer,
  tag: Buffer,
  additionalData: Buffer,
): Buffer {
  checkKey(key);
  if (iv.length !== IV_BYTES) throw new EnvelopeError("too-short", `the IV must be ${IV_BYTES} bytes`);
  if (tag.length !== TAG_BYTES)
    throw new EnvelopeError("tag-length", `the GCM tag is ${tag.length} bytes; it must be ${TAG_BYTES}`);
  const d = createDecipheriv("aes-256-gcm", key, iv, { authTagLength: TAG_BYTES });
  d.setAAD(additionalData);
  d.setAuthTag(tag);
  try {
    return Buffer.concat([d.update(ciphertext), d.final()]);
  } catch {
    throw new EnvelopeError(
      "authentication-failed",
      "the ciphertext failed authentication: it was altered, or it belongs to another row, secret or namespace",
    );
  }
}

/** Opens a body written by gcmSeal (IV | ciphertext | tag). */
export function gcmOpen(key: Buffer, additionalData: Buffer, body: Buffer): Buffer {
  if (body.length < IV_BYTES + TAG_BYTES)
    throw new EnvelopeError(
      "too-short",
      `the ciphertext body is ${body.length} bytes, shorter than an IV and a tag (${IV_BYTES + TAG_BYTES})`,
    );
  return gcmOpenParts(
    key,
    body.subarray(0, IV_BYTES),
    body.subarray(IV_BYTES, body.length - TAG_BYTES),
    body.subarray(body.length - TAG_BYTES),
    additionalData,
  );
}

/** Encrypts a secret value (its JSON text) under a NEK. */
export function sealSecret(
  nek: { id: string; key: Buffer },
  where: { namespace: string; versionId: string; name: string },
  plaintext: Buffer,
): Buffer {
  const header = encodeHeader({ kind: "secret", nekId: nek.id });
  const body = gcmSeal(
    nek.key,
    aad(header, secretContext(where.namespace, where.versionId, where.name)),
    plaintext,
  );
  return Buffer.concat([header, body]);
}

/** Decrypts a secret value; `nekKey` is looked up by the NEK id the header names. */
export function openSecret(
  envelope: ParsedEnvelope,
  nekKey: Buffer,
  where: { namespace: string; versionId: string; name: string },
): Buffer {
  return gcmOpen(
    nekKey,
    aad(envelope.headerBytes, secretContext(where.namespace, where.versionId, where.name)),
    envelope.body,
  );
}
