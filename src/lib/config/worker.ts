// The worker section: how workers keep their connections and inference servers alive.
import { z } from "zod";
import { seconds, section } from "./fields.js";

export const workerSection = section({
  keepAliveSeconds: seconds(10, 600),
  inferenceIdleSeconds: z.number().min(0).max(86_400).default(300),
});
