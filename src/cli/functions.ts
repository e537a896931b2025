// Functions are addressed by id or by name (names are unique), and versions by id; when a command
// needs one version and none was given, a function with exactly one version needs no --version.
import type { Api } from "./client.js";
import { CliError, usageError } from "./errors.js";

export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export interface InstanceDto {
  instanceId: string;
  functionId: string;
  functionVersionId: string;
  instanceType: string;
  instanceStatus: string;
  gpu: string;
  backend: string;
  location: string;
  message?: string;
  instanceCreatedAt: string;
  instanceUpdatedAt: string;
}

export interface FunctionDto {
  id: string;
  versionId: string;
  name: string;
  status: string;
  inferenceUrl: string;
  inferencePort: number;
  health?: { protocol: string; uri: string; port?: number; timeout: string; expectedStatusCode: number };
  containerImage?: string;
  containerArgs?: string;
  containerEnvironment?: Array<{ key: string; value: string }>;
  functionType?: string;
  tags?: string[];
  description?: string;
  createdAt: string;
  activeInstances?: InstanceDto[];
  /** Secret names (never values). */
  secrets?: string[];
}

export interface ResolvedFunction {
  id: string;
  name: string;
  versions: FunctionDto[];
}

/** Finds a function by id or name, with all its versions (oldest first). */
export async function resolveFunction(api: Api, ref: string): Promise<ResolvedFunction> {
  if (UUID.test(ref)) {
    const { functions } = await api.call<{ functions: FunctionDto[] }>(
      "GET",
      `/v2/nvcf/functions/${ref.toLowerCase()}/versions`,
    );
    return { id: ref.toLowerCase(), name: functions[0]?.name ?? "", versions: sortVersions(functions) };
  }
  const { functions } = await api.call<{ functions: FunctionDto[] }>("GET", "/v2/nvcf/functions");
  const versions = functions.filter((f) => f.name === ref);
  if (versions.length === 0) {
    throw new CliError(`no function named "${ref}"`, "FUNCTION_NOT_FOUND", {
      hint: "`callplane function list` shows the functions there are; a function can also be given by its id",
    });
  }
  return { id: versions[0].id, name: ref, versions: sortVersions(versions) };
}

function sortVersions(v: FunctionDto[]): FunctionDto[] {
  return [...v].sort((a, b) => a.createdAt.localeCompare(b.createdAt));
}

/** The version a command acts on: --version if given, else the only one there is. */
export function pickVersion(fn: ResolvedFunction, version: string | undefined, command: string): FunctionDto {
  if (version !== undefined) {
    const v = fn.versions.find((x) => x.versionId === version.toLowerCase());
    if (!v) {
      throw new CliError(`function "${fn.name}" has no version ${version}`, "VERSION_NOT_FOUND", {
        hint: `its versions: ${fn.versions.map((x) => x.versionId).join(", ")}`,
      });
    }
    return v;
  }
  if (fn.versions.length === 1) return fn.versions[0];
  throw usageError(
    `function "${fn.name}" has ${fn.versions.length} versions; choose one with --version <versionId>: ${fn.versions
      .map((x) => `${x.versionId} (${x.status}, created ${x.createdAt})`)
      .join(", ")}`,
    `for example: callplane ${command} ${fn.name} --version ${fn.versions[fn.versions.length - 1].versionId}`,
  );
}
