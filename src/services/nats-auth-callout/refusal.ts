// Why a login is refused: "denied" (the credentials are wrong) or "failed" (the callout could not
// decide, e.g. the webhook is down). The message is what the client is told; the fields are logged.
export class Refusal extends Error {
  constructor(
    readonly kind: "denied" | "failed",
    message: string,
    readonly fields: Record<string, unknown> = {},
  ) {
    super(message);
  }
}
