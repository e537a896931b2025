// The work message (nvcf.WorkerInvokeFunctionRequest, proto/nvcf/worker.proto) as this replica
// sends it, encoded by hand. protobuf-es's create() and toBinary() walk the schema by reflection
// and encode each string through a TextEncoder into a buffer of its own: profiled under load, that
// was a tenth of the invocation service's CPU per request. Here the sizes are counted first and
// every field is written once into a single buffer. The bytes are the ones toBinary() writes for
// the same message (work-message.test.ts checks that), so any protobuf decoder reads them.

/** What one work message carries (the fields the invocation service sets). */
export interface WorkMessageFields {
  requestId: string;
  ncaId: string;
  subject: string;
  maxDirectResponseSizeBytes: number;
  /** requestTime, in ms since the epoch (google.protobuf.Timestamp on the wire). */
  requestTimeMs: number;
  /** The inline part of the body; written only when not empty. */
  requestBody: Uint8Array | undefined;
  requestHeaders: ReadonlyArray<{ key: string; value: string }>;
  requestMethod: string;
  requestPath: string;
  /** statelessConfig.connectionConfigs[0].http1Config */
  http1: {
    targetURI: string;
    proxyURI: string | undefined;
    responseAuthorizationToken: string;
    requestAuthorizationToken: string | undefined;
  };
}

// Wire types: 0 varint, 2 length-delimited. A tag is (field << 3) | wire type.
const LEN = 2;

function varintSize(n: number): number {
  let s = 1;
  while (n >= 0x80) {
    n = Math.floor(n / 128);
    s++;
  }
  return s;
}

function writeVarint(buf: Buffer, off: number, n: number): number {
  while (n >= 0x80) {
    // (n & 0x7f) keeps the low 7 bits even past 2^32: ToInt32 keeps the low 32
    buf[off++] = (n & 0x7f) | 0x80;
    n = Math.floor(n / 128);
  }
  buf[off++] = n;
  return off;
}

/** Size of a length-delimited field (tag below 16: one byte) whose payload is `len` bytes. */
const lenField = (len: number): number => 1 + varintSize(len) + len;

/**
 * The message for these fields. Fields at their proto3 default (empty strings, zero numbers) are
 * left out, as toBinary() leaves them out; the `optional` ones (requestBody, proxyURI,
 * requestAuthorizationToken) are written when given.
 */
export function encodeWorkMessage(f: WorkMessageFields): Buffer {
  // string byte lengths, counted once and used again when writing
  const bl = (s: string): number => Buffer.byteLength(s, "utf8");
  const idLen = bl(f.requestId);
  const ncaLen = bl(f.ncaId);
  const subLen = bl(f.subject);
  const methodLen = bl(f.requestMethod);
  const pathLen = bl(f.requestPath);
  const seconds = Math.floor(f.requestTimeMs / 1000);
  const nanos = (f.requestTimeMs - seconds * 1000) * 1_000_000;
  const tsLen = (seconds !== 0 ? 1 + varintSize(seconds) : 0) + (nanos !== 0 ? 1 + varintSize(nanos) : 0);
  const h = f.http1;
  const proxyLen = h.proxyURI === undefined ? -1 : bl(h.proxyURI);
  const targetLen = bl(h.targetURI);
  const respLen = bl(h.responseAuthorizationToken);
  const reqTokLen = h.requestAuthorizationToken === undefined ? -1 : bl(h.requestAuthorizationToken);
  const http1Len =
    (proxyLen >= 0 ? lenField(proxyLen) : 0) +
    (targetLen ? lenField(targetLen) : 0) +
    (respLen ? lenField(respLen) : 0) +
    (reqTokLen >= 0 ? lenField(reqTokLen) : 0);
  const connLen = lenField(http1Len);
  const statelessLen = lenField(connLen);
  const headerLens = new Array<number>(f.requestHeaders.length * 2);
  let headersLen = 0;
  for (let i = 0; i < f.requestHeaders.length; i++) {
    const kl = bl(f.requestHeaders[i].key);
    const vl = bl(f.requestHeaders[i].value);
    headerLens[2 * i] = kl;
    headerLens[2 * i + 1] = vl;
    headersLen += lenField((kl ? lenField(kl) : 0) + (vl ? lenField(vl) : 0));
  }
  const body = f.requestBody !== undefined && f.requestBody.length > 0 ? f.requestBody : undefined;
  const size =
    (idLen ? lenField(idLen) : 0) +
    (ncaLen ? lenField(ncaLen) : 0) +
    (subLen ? lenField(subLen) : 0) +
    (f.maxDirectResponseSizeBytes ? 1 + varintSize(f.maxDirectResponseSizeBytes) : 0) +
    (tsLen ? lenField(tsLen) : 0) +
    (body ? lenField(body.length) : 0) +
    headersLen +
    (methodLen ? lenField(methodLen) : 0) +
    (pathLen ? lenField(pathLen) : 0) +
    // field 18: a two-byte tag
    varintSize((18 << 3) | LEN) +
    varintSize(statelessLen) +
    statelessLen;

  const buf = Buffer.allocUnsafe(size);
  let o = 0;
  const str = (field: number, s: string, len: number): void => {
    buf[o++] = (field << 3) | LEN;
    o = writeVarint(buf, o, len);
    o += buf.write(s, o, len, "utf8");
  };
  if (idLen) str(1, f.requestId, idLen);
  if (ncaLen) str(2, f.ncaId, ncaLen);
  if (subLen) str(3, f.subject, subLen);
  if (f.maxDirectResponseSizeBytes) {
    buf[o++] = 5 << 3;
    o = writeVarint(buf, o, f.maxDirectResponseSizeBytes);
  }
  if (tsLen) {
    buf[o++] = (8 << 3) | LEN;
    o = writeVarint(buf, o, tsLen);
    if (seconds !== 0) {
      buf[o++] = 1 << 3;
      o = writeVarint(buf, o, seconds);
    }
    if (nanos !== 0) {
      buf[o++] = 2 << 3;
      o = writeVarint(buf, o, nanos);
    }
  }
  if (body) {
    buf[o++] = (10 << 3) | LEN;
    o = writeVarint(buf, o, body.length);
    buf.set(body, o);
    o += body.length;
  }
  for (let i = 0; i < f.requestHeaders.length; i++) {
    const kl = headerLens[2 * i];
    const vl = headerLens[2 * i + 1];
    buf[o++] = (13 << 3) | LEN;
    o = writeVarint(buf, o, (kl ? lenField(kl) : 0) + (vl ? lenField(vl) : 0));
    if (kl) str(1, f.requestHeaders[i].key, kl);
    if (vl) str(2, f.requestHeaders[i].value, vl);
  }
  if (methodLen) str(14, f.requestMethod, methodLen);
  if (pathLen) str(15, f.requestPath, pathLen);
  // statelessConfig (18) { connectionConfigs (1) { http1Config (1) { ... } } }
  o = writeVarint(buf, o, (18 << 3) | LEN);
  o = writeVarint(buf, o, statelessLen);
  buf[o++] = (1 << 3) | LEN;
  o = writeVarint(buf, o, connLen);
  buf[o++] = (1 << 3) | LEN;
  o = writeVarint(buf, o, http1Len);
  if (proxyLen >= 0) str(1, h.proxyURI!, proxyLen);
  if (targetLen) str(2, h.targetURI, targetLen);
  if (respLen) str(3, h.responseAuthorizationToken, respLen);
  if (reqTokLen >= 0) str(4, h.requestAuthorizationToken!, reqTokLen);
  if (o !== size) throw new Error(`work message: wrote ${o} of ${size} bytes`);
  return buf;
}
