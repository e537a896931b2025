// The envelope format, byte for byte: golden vectors recorded once must open forever, and every
// kind of tampering is refused with a reason (and never with a plaintext).
import assert from "node:assert/strict";
import { createDecipheriv, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import {
  EnvelopeError,
  IV_BYTES,
  TAG_BYTES,
  aad,
  encodeHeader,
  gcmOpen,
  gcmOpenParts,
  gcmSeal,
  nekContext,
  openSecret,
  parseEnvelope,
  sealSecret,
  type EnvelopeProblem,
} from "./envelope.js";
import { KEYRING_FORMAT, createEnvMekProvider } from "./mek.js";

// compiled to dist/src/lib/secrets/: the repository root is four levels up
const repoRoot = join(import.meta.dirname, "..", "..", "..", "..");

interface Golden {
  format: number;
  mek: { kid: string; key: string };
  neks: Array<{ namespace: string; nekId: string; key: string; wrapped: string }>;
  secrets: Array<{
    functionId: string;
    versionId: string;
    name: string;
    nekId: string;
    ciphertext: string;
    value: unknown;
  }>;
}
const golden = JSON.parse(
  readFileSync(join(repoRoot, "test", "fixtures", "secrets-golden-v1.json"), "utf8"),
) as Golden;

function refused(fn: () => unknown, problem: EnvelopeProblem | EnvelopeProblem[], what: string): void {
  const want = Array.isArray(problem) ? problem : [problem];
  assert.throws(
    fn,
    (err: unknown) => {
      assert.ok(err instanceof EnvelopeError, `${what}: ${String(err)}`);
      assert.ok(want.includes(err.problem), `${what}: ${err.problem} (${err.message})`);
      return true;
    },
    what,
  );
}

test("golden vectors of format 1 open: NEKs through the env MEK provider, values through the NEKs", async () => {
  assert.equal(golden.format, 1);
  assert.ok(golden.neks.length >= 2 && golden.secrets.length >= 8, "the fixture holds the recorded vectors");
  const provider = createEnvMekProvider(
    "GOLDEN",
    JSON.stringify({ format: KEYRING_FORMAT, keys: [{ kid: golden.mek.kid, key: golden.mek.key }] }),
  );
  const neks = new Map<string, Buffer>();
  for (const n of golden.neks) {
    const env = parseEnvelope(Buffer.from(n.wrapped, "base64"), "nek");
    assert.deepEqual(env.header, { version: 1, kind: "nek", mekKid: golden.mek.kid, nekId: n.nekId });
    const key = await provider.unwrap(
      env.header.mekKid,
      env.body,
      aad(env.headerBytes, nekContext(n.namespace)),
    );
    assert.equal(key.toString("base64"), n.key, `NEK ${n.nekId}`);
    neks.set(n.nekId, key);
  }
  for (const s of golden.secrets) {
    const env = parseEnvelope(Buffer.from(s.ciphertext, "base64"), "secret");
    assert.deepEqual(env.header, { version: 1, kind: "secret", mekKid: "", nekId: s.nekId });
    const plain = openSecret(env, neks.get(s.nekId)!, {
      namespace: `function:${s.functionId}`,
      versionId: s.versionId,
      name: s.name,
    });
    assert.deepEqual(JSON.parse(plain.toString("utf8")), s.value, `${s.versionId}/${s.name}`);
  }
});

test("the layout is fixed: magic, version, kind, length-prefixed ids, then a 12-byte IV and a 16-byte tag", () => {
  // if this test must change, every stored ciphertext (and the golden vectors) would be unreadable
  const h = encodeHeader({ kind: "nek", mekKid: "m1", nekId: "n-22" });
  assert.equal(h.toString("hex"), "4350" + "01" + "01" + "02" + "6d31" + "04" + "6e2d3232");
  const s = encodeHeader({ kind: "secret", nekId: "n-22" });
  assert.equal(s.toString("hex"), "4350" + "01" + "02" + "00" + "04" + "6e2d3232");
  const key = randomBytes(32);
  const plain = Buffer.from("x".repeat(100));
  const body = gcmSeal(key, Buffer.alloc(0), plain);
  assert.equal(body.length, IV_BYTES + plain.length + TAG_BYTES, "no compression, no padding");
  // the tag is the last 16 bytes and the IV the first 12: open them with node:crypto directly
  const d = createDecipheriv("aes-256-gcm", key, body.subarray(0, 12), { authTagLength: 16 });
  d.setAuthTag(body.subarray(body.length - 16));
  assert.deepEqual(Buffer.concat([d.update(body.subarray(12, body.length - 16)), d.final()]), plain);
});

test("tamper corpus: a flipped bit anywhere, a short tag, a wrong kind, version or place is refused", () => {
  const nek = { id: "nek-0123456789abcdef", key: randomBytes(32) };
  const where = { namespace: "function:f1", versionId: "v1", name: "API_TOKEN" };
  const ct = sealSecret(nek, where, Buffer.from(JSON.stringify("top secret value")));
  const open = (data: Buffer, w = where, key = nek.key) => openSecret(parseEnvelope(data, "secret"), key, w);
  assert.equal(JSON.parse(open(ct).toString()), "top secret value");
  const headerLen = parseEnvelope(ct, "secret").headerBytes.length;

  // every single bit of the header
  for (let i = 0; i < headerLen; i++) {
    for (let bit = 0; bit < 8; bit++) {
      const t = Buffer.from(ct);
      t[i] ^= 1 << bit;
      refused(
        () => open(t),
        ["not-an-envelope", "unsupported-version", "malformed-header", "wrong-kind", "authentication-failed"],
        `header byte ${i} bit ${bit}`,
      );
    }
  }
  // a bit of the IV, of the ciphertext, of the tag
  for (const [label, at] of [
    ["IV", headerLen + 3],
    ["ciphertext", headerLen + IV_BYTES + 2],
    ["tag", ct.length - 1],
    ["tag start", ct.length - TAG_BYTES],
  ] as const) {
    const t = Buffer.from(ct);
    t[at] ^= 0x10;
    refused(() => open(t), "authentication-failed", label);
  }
  // a truncated ciphertext: what remains at the end is taken as the tag, and fails
  refused(() => open(ct.subarray(0, ct.length - 4)), "authentication-failed", "4 bytes cut off the tag");
  refused(() => open(ct.subarray(0, headerLen + 20)), "too-short", "shorter than an IV and a tag");
  // Node 20 accepts a 4-byte tag unless told otherwise (DEP0182); gcmOpenParts never does
  const env = parseEnvelope(ct, "secret");
  const body = env.body;
  refused(
    () =>
      gcmOpenParts(
        nek.key,
        body.subarray(0, IV_BYTES),
        body.subarray(IV_BYTES, body.length - TAG_BYTES),
        body.subarray(body.length - TAG_BYTES, body.length - TAG_BYTES + 4),
        aad(
          env.headerBytes,
          Buffer.from(JSON.stringify(["secret", where.namespace, where.versionId, where.name])),
        ),
      ),
    "tag-length",
    "a 4-byte tag",
  );
  // moved: another secret, another version, another namespace, another key
  refused(() => open(ct, { ...where, name: "OTHER" }), "authentication-failed", "another secret name");
  refused(() => open(ct, { ...where, versionId: "v2" }), "authentication-failed", "another version");
  refused(
    () => open(ct, { ...where, namespace: "function:f2" }),
    "authentication-failed",
    "another namespace",
  );
  refused(() => open(ct, where, randomBytes(32)), "authentication-failed", "another NEK");
  // the wrong kind, an unknown version, garbage
  refused(() => parseEnvelope(ct, "nek"), "wrong-kind", "a secret read as a NEK");
  const v2 = Buffer.from(ct);
  v2[2] = 2;
  refused(() => parseEnvelope(v2, "secret"), "unsupported-version", "format version 2");
  refused(() => parseEnvelope(Buffer.from("not a ciphertext"), "secret"), "not-an-envelope", "garbage");
  refused(() => parseEnvelope(Buffer.alloc(0), "secret"), "not-an-envelope", "empty");
  // a NEK id length that runs past the end
  const cut = Buffer.from(ct.subarray(0, 6));
  refused(() => parseEnvelope(cut, "secret"), "malformed-header", "a header cut short");
});

test("errors never carry the plaintext", () => {
  const key = randomBytes(32);
  const marker = "plaintext-marker-in-an-error";
  const body = gcmSeal(key, Buffer.from("a"), Buffer.from(marker));
  for (const t of [
    () => gcmOpen(key, Buffer.from("b"), body),
    () => gcmOpen(randomBytes(32), Buffer.from("a"), body),
  ]) {
    try {
      t();
      assert.fail("opened");
    } catch (err) {
      assert.ok(!String((err as Error).message).includes(marker));
      assert.ok(!JSON.stringify(err).includes(marker));
    }
  }
});
