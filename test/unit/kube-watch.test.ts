// lib/kube's list-then-watch loop against a small HTTP server that plays the API server's watch
// protocol exactly where the real one cannot be made to (tests/integration/kubernetes run the real
// one): a watch line split inside a UTF-8 character, a watch that ends and is resumed from the last
// resourceVersion, and a 410 Gone that makes it list again.
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { KubeClient, watchCollection, type KubeObject } from "../../src/lib/kube/index.js";
import { waitFor } from "../testkit/client.js";

const pod = (name: string, rv: string, note = "") => ({
  apiVersion: "v1",
  kind: "Pod",
  metadata: { name, resourceVersion: rv, annotations: { note } },
});

void test("list, then watch: a character split across chunks, a watch resumed from its last version, a 410 listed again", async (t) => {
  const seen: string[] = [];
  let watches = 0;
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const u = new URL(req.url ?? "/", "http://x");
    seen.push(
      `${u.searchParams.get("watch") ? "watch" : "list"}@${u.searchParams.get("resourceVersion") ?? ""}`,
    );
    if (!u.searchParams.get("watch")) {
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify({ metadata: { resourceVersion: "10" }, items: [pod("a", "9")] }));
      return;
    }
    watches++;
    res.writeHead(200, { "content-type": "application/json" });
    if (watches === 1) {
      // "función": the ó (two bytes) split between two writes; then the watch ends
      const line = Buffer.from(`${JSON.stringify({ type: "ADDED", object: pod("b", "11", "función") })}\n`);
      const at = line.indexOf(Buffer.from("ó")) + 1;
      res.write(line.subarray(0, at));
      setTimeout(() => res.end(line.subarray(at)), 50);
    } else if (watches === 2) {
      // resumed from 11; the version is too old now: 410, as an ERROR event
      res.end(
        `${JSON.stringify({ type: "ERROR", object: { kind: "Status", code: 410, message: "too old resource version" } })}\n`,
      );
    } else {
      res.write(`${JSON.stringify({ type: "DELETED", object: pod("a", "12") })}\n`);
    }
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  t.after(() => server.close());
  const client = new KubeClient({
    server: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    caPem: "",
  });
  const lists: string[][] = [];
  const events: Array<[string, string, string]> = [];
  const w = watchCollection<KubeObject>(
    client,
    "/api/v1/namespaces/w/pods",
    {},
    {
      onList: (items) => lists.push(items.map((i) => i.metadata!.name!)),
      onEvent: (type, o) => events.push([type, o.metadata!.name!, o.metadata!.annotations?.note ?? ""]),
    },
    { retryMs: 10 },
  );
  t.after(async () => {
    w.stop();
    await client.close();
  });
  await waitFor(
    "the DELETED event after the second list",
    () => events.some(([type]) => type === "DELETED"),
    5000,
  );
  assert.deepEqual(events[0], ["ADDED", "b", "función"]);
  assert.deepEqual(lists, [["a"], ["a"]], "listed at start and again after the 410");
  assert.deepEqual(seen.slice(0, 5), ["list@", "watch@10", "watch@11", "list@", "watch@10"]);
  assert.equal(w.lists, 2);
});
