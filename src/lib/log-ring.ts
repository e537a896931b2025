// A service's recent log lines, kept in memory for the operator console's Logs page: the last
// RECENT_LOG_LINES lines the service wrote (at its configured level: pino drops the others before
// they are serialized). Keeping one costs a store of the string pino already made into a slot of a
// fixed array: no parse, no copy, no allocation per line. The lines are read, parsed and filtered
// only when the console asks (plane/console-logs.ts), newest first.

/** Lines a service keeps (about 1 MB at a few hundred bytes a line). */
export const RECENT_LOG_LINES = 2000;

export class LogRing {
  private readonly slots: Array<string | undefined>;
  private next = 0;

  constructor(readonly capacity = RECENT_LOG_LINES) {
    this.slots = new Array<string | undefined>(capacity);
  }

  push(line: string): void {
    this.slots[this.next] = line;
    this.next = this.next + 1 === this.capacity ? 0 : this.next + 1;
  }

  /** The lines kept, newest first, as written (a JSON object and a newline). */
  *newestFirst(): Generator<string> {
    for (let n = 0, i = this.next; n < this.capacity; n++) {
      i = i === 0 ? this.capacity - 1 : i - 1;
      const line = this.slots[i];
      if (line === undefined) return;
      yield line;
    }
  }
}
