// The progress of one request in NVCF's compatibility mode: the inference server may write a
// `progress` file (percentage and partial response) into its output folder; each new version is
// read once and reported to the client in the next 202.
import { constants } from "node:fs";
import { lstat, readFile } from "node:fs/promises";
import { join } from "node:path";
import { serializeResponseHead } from "../../lib/http/index.js";
import type { Logger } from "../../lib/log.js";

export class ProgressReport {
  private progress: { percent: number | undefined; partial: unknown } | undefined;
  /** A newer progress was read than the last 202 carried. */
  unreported = false;
  private mtime = 0;

  constructor(
    private readonly requestId: string,
    private readonly logger: Logger,
  ) {}

  /** Reads the progress file in `dir`, if it changed since the last look. */
  async check(dir: string): Promise<void> {
    const file = join(dir, "progress");
    let mtime: number;
    try {
      const st = await lstat(file);
      if (!st.isFile()) return;
      mtime = st.mtimeMs;
    } catch {
      return;
    }
    if (mtime <= this.mtime) return;
    this.mtime = mtime;
    try {
      // the folder is the inference server's (it may run as another, less trusted user): never
      // read through a link it put there to a file only this worker may read
      const text = await readFile(file, {
        encoding: "utf8",
        flag: constants.O_RDONLY | constants.O_NOFOLLOW,
      });
      const p = JSON.parse(text) as {
        id?: string;
        progress?: number;
        partialResponse?: unknown;
      };
      if (p.id !== undefined && p.id !== this.requestId) return;
      this.progress = {
        percent: typeof p.progress === "number" ? Math.max(0, Math.min(100, p.progress)) : undefined,
        partial: p.partialResponse,
      };
      this.unreported = true;
    } catch (err) {
      this.logger.debug(
        { requestId: this.requestId, err: (err as Error).message },
        "progress file is not valid JSON yet",
      );
    }
  }

  /** A framed 202 with the progress as it stands: the partial response and the percentage. */
  message(): Buffer {
    const body =
      this.progress?.partial !== undefined
        ? Buffer.from(JSON.stringify(this.progress.partial))
        : Buffer.alloc(0);
    const headers: Array<[string, string]> = [];
    if (body.length) headers.push(["Content-Type", "application/json"]);
    if (this.progress?.percent !== undefined)
      headers.push(["NVCF-PERCENT-COMPLETE", String(this.progress.percent)]);
    headers.push(["Content-Length", String(body.length)]);
    return Buffer.concat([serializeResponseHead(202, headers), body]);
  }
}
