// What a function may run on the local compute backend, shared by the API (which refuses it at the
// door) and the compute agent (which refuses it again, for a deployment that reached it some other
// way). `local/command` runs any command line on the agent's machine, so it is off unless the
// environment file turns it on (compute.local.allowCommand). While it is off, the built-in images
// (callplane's own example servers, Node programs) must not be turned into it through their
// environment either: NODE_OPTIONS=--import data:... or LD_PRELOAD would run code of the
// function's choosing all the same.

export const LOCAL_COMMAND_IMAGE = "local/command";

/** Environment variable names that make a program (Node, the dynamic loader) load other code. */
const CODE_LOADING_ENV = /^(NODE_OPTIONS|NODE_PATH|NODE_REPL_EXTERNAL_MODULE|LD_.*|DYLD_.*)$/;

export function loadsCode(envName: string): boolean {
  // a name with "=" in it (which the API refuses) sets the variable before the "=" (KEY=x=value)
  return CODE_LOADING_ENV.test(envName.split("=", 1)[0]);
}

export interface LocalImageRefusal {
  /** The request field at fault, as the API names it. */
  field: string;
  message: string;
}

/**
 * Why the local backend must not run this function while local/command is off, or undefined.
 * Images outside `local/` are not the local backend's business here (it reports them ERRORED).
 */
export function localImageRefusal(
  spec: {
    containerImage: string;
    containerEnvironment?: ReadonlyArray<{ key: string }> | undefined;
  },
  allowCommand: boolean,
): LocalImageRefusal | undefined {
  if (allowCommand || !spec.containerImage.startsWith("local/")) return undefined;
  if (spec.containerImage === LOCAL_COMMAND_IMAGE)
    return {
      field: "containerImage",
      message: `containerImage ${LOCAL_COMMAND_IMAGE} runs any command line on the compute agent's machine and is off on this plane; use a built-in image (local/echo, local/example, local/grpc-echo, ...), or have the operator set compute.local.allowCommand: true in the environment file`,
    };
  const i = (spec.containerEnvironment ?? []).findIndex((e) => loadsCode(e.key));
  if (i === -1) return undefined;
  const name = spec.containerEnvironment![i].key;
  return {
    field: `containerEnvironment[${i}].key`,
    message: `containerEnvironment ${name}: a variable that makes the server load other code (NODE_OPTIONS, NODE_PATH, LD_*, DYLD_*) would run a command of the function's choosing, which this plane does not allow (compute.local.allowCommand is off); remove it`,
  };
}
