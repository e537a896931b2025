// The per-function series a front door keeps (function_id, function_version_id labels), bounded.
// A series is made only for a function version the replica has served: one the API authorized for
// the caller's key, never an id taken from a request that was refused (any UUID can be sent), so the
// label values are as many as the deployed versions that were called here. Past `limit` versions a
// replica adds no more: later ones share one series labelled `other`, and a restart starts afresh.
// The count of versions a replica serves is small (every peer labels per function); the limit is a
// guard against a plane with thousands, not the expected case.

/** The label value of the shared series past the limit. */
export const OTHER_FUNCTION = "other";

/** Function versions a replica labels its series with before the rest share `other`. */
export const DEFAULT_FUNCTION_SERIES_LIMIT = 500;

export class FunctionSeriesTable<S> {
  private readonly byVersion = new Map<string, S>();
  private other: S | undefined;

  constructor(
    private readonly limit: number,
    private readonly make: (functionId: string, functionVersionId: string) => S,
  ) {}

  /** The series of a version (a version id names its function: it is the key). */
  get(functionId: string, functionVersionId: string): S {
    const s = this.byVersion.get(functionVersionId);
    if (s !== undefined) return s;
    if (this.byVersion.size >= this.limit) return (this.other ??= this.make(OTHER_FUNCTION, OTHER_FUNCTION));
    const made = this.make(functionId, functionVersionId);
    this.byVersion.set(functionVersionId, made);
    return made;
  }

  /** Every series made so far, the shared one last. */
  *values(): IterableIterator<S> {
    yield* this.byVersion.values();
    if (this.other !== undefined) yield this.other;
  }

  /** How many versions have series of their own. */
  get size(): number {
    return this.byVersion.size;
  }
}
