// The states of a function instance, as the compute agent reports them and the API stores them
// (the API's instance rows, the compute backends). Shared here so that neither imports the other.
export type InstanceStatus = "STARTING" | "ACTIVE" | "ERRORED" | "TERMINATED";
