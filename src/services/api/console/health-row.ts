// One row of the health page (health.ts and the health-*.ts modules that make rows of their part).

export type State = "up" | "down" | "degraded" | "draining" | "unknown";

export interface Row {
  component: string;
  id?: string;
  state: State;
  version?: string | undefined;
  where?: string | undefined;
  detail: string;
}
