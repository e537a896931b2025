// A list-then-watch loop over one collection, as an informer does: list (the full state, handed
// over whole so the caller can notice what went while it was not watching), then watch from that
// list's resourceVersion; a watch that ends is resumed from the last resourceVersion seen (bookmarks
// included); a 410 Gone (the version is too old) lists again. Errors other than 410 are retried
// with a capped backoff, never given up on: the caller stops the loop.
import { setTimeout as sleep } from "node:timers/promises";
import { isGone, KubeError, type KubeClient, type KubeObject } from "./client.js";

export type WatchEventType = "ADDED" | "MODIFIED" | "DELETED";

export interface WatchHandlers<T extends KubeObject> {
  /** After each list: every object there is now (the first one, and after a 410). */
  onList(items: T[]): void;
  onEvent(type: WatchEventType, obj: T): void;
  /** A list or watch failed and is retried (for logs). */
  onError?(err: Error): void;
}

export interface CollectionWatch {
  /** Resolves after the first list was handed over. */
  readonly synced: Promise<void>;
  /** Lists handed over so far (1 after the first; more after each 410 or error). */
  readonly lists: number;
  stop(): void;
}

export function watchCollection<T extends KubeObject>(
  client: KubeClient,
  path: string,
  selector: { labelSelector?: string; fieldSelector?: string },
  h: WatchHandlers<T>,
  opts: { timeoutSeconds?: number; retryMs?: number } = {},
): CollectionWatch {
  const ac = new AbortController();
  let resolveSynced!: () => void;
  const synced = new Promise<void>((r) => (resolveSynced = r));
  const state = { lists: 0 };
  let version = "";
  let backoff = opts.retryMs ?? 250;

  const list = async () => {
    const l = await client.list<T>(path, { query: { ...selector, limit: undefined }, signal: ac.signal });
    version = l.metadata.resourceVersion;
    state.lists++;
    h.onList(l.items);
    resolveSynced();
  };

  const watchOnce = async () => {
    const res = await client.send("GET", path, {
      query: {
        ...selector,
        watch: 1,
        resourceVersion: version,
        allowWatchBookmarks: true,
        // the server ends the watch after this; it is resumed from the last version seen
        timeoutSeconds: opts.timeoutSeconds ?? 300,
      },
      signal: ac.signal,
      timeoutMs: 60_000,
      // bookmarks come about every minute and the server ends the watch at timeoutSeconds: a watch
      // silent for longer than that is a dead connection, retried from the last version
      bodyTimeoutMs: ((opts.timeoutSeconds ?? 300) + 60) * 1000,
    });
    if (res.statusCode >= 300) {
      const text = await res.body.text();
      throw new KubeError(
        res.statusCode,
        res.statusCode === 410 ? "Expired" : "",
        `watch ${path}: ${res.statusCode} ${text.slice(0, 300)}`,
      );
    }
    let rest = "";
    // one decoder for the whole stream: a character split across two chunks is joined, not mangled
    const decoder = new TextDecoder("utf-8");
    for await (const chunk of res.body) {
      rest += decoder.decode(chunk as Buffer, { stream: true });
      let nl: number;
      while ((nl = rest.indexOf("\n")) >= 0) {
        const line = rest.slice(0, nl);
        rest = rest.slice(nl + 1);
        if (!line.trim()) continue;
        const ev = JSON.parse(line) as { type: string; object: T & { code?: number; message?: string } };
        if (ev.type === "ERROR") {
          const code = ev.object.code ?? 500;
          throw new KubeError(
            code,
            code === 410 ? "Expired" : "",
            `watch ${path}: ${ev.object.message ?? "error"}`,
          );
        }
        const rv = ev.object.metadata?.resourceVersion;
        if (rv) version = rv;
        backoff = opts.retryMs ?? 250;
        if (ev.type === "BOOKMARK") continue;
        h.onEvent(ev.type as WatchEventType, ev.object);
      }
    }
  };

  void (async () => {
    let needList = true;
    while (!ac.signal.aborted) {
      try {
        if (needList) {
          await list();
          needList = false;
        }
        await watchOnce();
      } catch (err) {
        if (ac.signal.aborted) return;
        if (isGone(err)) {
          needList = true;
          continue;
        }
        h.onError?.(err as Error);
        await sleep(backoff, undefined, { signal: ac.signal }).catch(() => undefined);
        backoff = Math.min(backoff * 2, 10_000);
      }
    }
  })();

  return {
    synced,
    get lists() {
      return state.lists;
    },
    stop: () => ac.abort(),
  };
}
