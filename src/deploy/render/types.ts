// What a render takes and gives back: the shapes the CLI, validate.ts and the tests see, whichever
// component module made the objects.
import type { Config } from "../../lib/config/index.js";
import type { RawDocument } from "../cluster-config.js";

/** What every rendered object offers, whichever models package made it. */
export interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata?: { name?: string; namespace?: string } | undefined;
  toJSON(): unknown;
  validate(): void;
}

export interface RenderedFile {
  name: string;
  objects: K8sObject[];
}

/** A Secret the manifests reference, what keys it must hold, and who mounts it. */
export interface SecretUse {
  name: string;
  keys: string[];
  usedBy: string[];
  how: string;
}

export interface RenderResult {
  namespace: string;
  workerNamespace: string;
  files: RenderedFile[];
  secrets: SecretUse[];
  notes: string[];
}

export class RenderError extends Error {
  readonly problems: string[];
  constructor(source: string, problems: string[]) {
    super(`cannot render ${source}:\n${problems.map((p) => `  - ${p}`).join("\n")}`);
    this.name = "RenderError";
    this.problems = problems;
  }
}

export interface RenderInput {
  config: Config;
  /** The environment file as written (to tell what it sets from what defaults). */
  raw: RawDocument;
  /** callplane's version: the default image tag and the version label. */
  version: string;
  source: string;
}
