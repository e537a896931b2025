// The Secrets a render references: each one once, with every key any pod needs from it and every
// workload that mounts it, in the order the components first name them (the CLI lists them so).
// Nothing here sees a Secret's value: `callplane credentials generate` makes the contents.
import type { SecretUse } from "./types.js";

export class SecretRegistry {
  private readonly uses = new Map<string, SecretUse>();

  /** Records that `usedBy` needs `keys` of the Secret `name`, merged with earlier uses of it. */
  use(name: string, keys: string[], usedBy: string, how: string): void {
    const cur = this.uses.get(name);
    if (cur) {
      for (const k of keys) if (!cur.keys.includes(k)) cur.keys.push(k);
      if (!cur.usedBy.includes(usedBy)) cur.usedBy.push(usedBy);
    } else {
      this.uses.set(name, { name, keys: [...keys], usedBy: [usedBy], how });
    }
  }

  /** Records a Secret's use as given, replacing any earlier record of it. */
  set(name: string, use: SecretUse): void {
    this.uses.set(name, use);
  }

  list(): SecretUse[] {
    return [...this.uses.values()];
  }
}
