// 20-api.yaml: the API (with the API keys and secret store), its keys and tokens, the MEK keyring
// as the secret store's provider wants it, and its database: a volume claim for SQLite, a Secret's
// URL for PostgreSQL.
import { basename } from "node:path";
import { PersistentVolumeClaim, type IEnvVar, type IVolume, type IVolumeMount } from "kubernetes-models/v1";
import { SERVICE_SCOPES, type ServiceName } from "../../lib/identity/index.js";
import { KEY_FILES } from "../../lib/nats/index.js";
import { MOUNTS, SECRETS, SERVICES, WORKLOADS, type Workload } from "../layout.js";
import type { RenderContext } from "./context.js";
import {
  baseVolumes,
  caVolume,
  container,
  natsKeyVolume,
  podSpec,
  roleKey,
  secretVolume,
  tokenVolume,
} from "./pod.js";
import type { K8sObject } from "./types.js";
import { deployment, pdb, service, serviceAccount } from "./workload.js";

function mekParts(
  k: RenderContext,
  w: Workload,
): { volumes: IVolume[]; mounts: IVolumeMount[]; env: IEnvVar[] } {
  const m = k.c.secrets.mek;
  if (m.provider === "file") {
    return {
      volumes: [
        secretVolume(
          k,
          "mek",
          SECRETS.mek,
          ["mek.json"],
          w,
          "the MEK keyring (`callplane credentials generate`; rotation: docs/kubernetes.md)",
        ),
      ],
      mounts: [{ name: "mek", mountPath: MOUNTS.mek, readOnly: true }],
      env: [],
    };
  }
  if (m.provider === "env") {
    k.secrets.use(SECRETS.mek, ["keyring"], w.name, `the MEK keyring JSON, given as ${m.envVariable}`);
    return {
      volumes: [],
      mounts: [],
      env: [{ name: m.envVariable, valueFrom: { secretKeyRef: { name: SECRETS.mek, key: "keyring" } } }],
    };
  }
  return { volumes: [], mounts: [], env: [] };
}

export function renderApi(k: RenderContext): K8sObject[] {
  const w = WORKLOADS.api;
  const c = k.c;
  const base = baseVolumes();
  const sqlite = c.api.database.driver === "sqlite";
  const natsFiles = [roleKey("api"), roleKey("api-revoker")];
  // token mode: the API does not hold the shared worker key at all, so it cannot hand it out
  if (c.nats.workerAuth === "nkey") natsFiles.push(basename(KEY_FILES.worker("/")));
  const keys = natsKeyVolume(k, w, natsFiles);
  const tokens = tokenVolume(k, w, Object.keys(SERVICE_SCOPES) as ServiceName[]);
  const mek = mekParts(k, w);
  const volumes: IVolume[] = [
    ...base.volumes,
    keys.volume,
    tokens.volume,
    caVolume(),
    secretVolume(
      k,
      "admin-key",
      SECRETS.adminKey,
      ["admin-signing.pub.pem"],
      w,
      "the public key of the stack's admin key (or of your identity provider); its private key stays with you",
    ),
    secretVolume(
      k,
      "worker-identity",
      SECRETS.workerIdentity,
      ["worker-identity.key.pem"],
      w,
      "the key with which the API signs worker identity tokens",
    ),
    ...mek.volumes,
  ];
  const mounts: IVolumeMount[] = [
    ...base.mounts,
    keys.mount,
    tokens.mount,
    { name: "stack-ca", mountPath: MOUNTS.ca, readOnly: true },
    { name: "admin-key", mountPath: MOUNTS.adminKey, readOnly: true },
    { name: "worker-identity", mountPath: MOUNTS.workerIdentity, readOnly: true },
    ...mek.mounts,
  ];
  if (c.adminIssuerProxy.enabled) {
    volumes.push(
      secretVolume(
        k,
        "issuer-key",
        SECRETS.issuerKey,
        ["admin-issuer.pub.pem"],
        w,
        "the admin issuer's key pair (the API reads only the public key)",
      ),
    );
    mounts.push({ name: "issuer-key", mountPath: MOUNTS.issuerKey, readOnly: true });
  }
  if (sqlite) {
    volumes.push({ name: "db", persistentVolumeClaim: { claimName: `${w.name}-db` } });
    mounts.push({ name: "db", mountPath: MOUNTS.sqliteDir });
  }
  const env: IEnvVar[] = [...mek.env];
  if (!sqlite) {
    k.secrets.use(
      SECRETS.database,
      ["url"],
      w.name,
      "the PostgreSQL URL, postgres://user:password@host:port/database",
    );
    env.push({
      name: "CALLPLANE__API__DATABASE__URL",
      valueFrom: { secretKeyRef: { name: SECRETS.database, key: "url" } },
    });
  }
  const spec = podSpec(
    k,
    w,
    [
      container(k, w, {
        ports: [{ name: "http", containerPort: k.plan.ports.api }],
        env,
        mounts,
        probePort: "http",
      }),
    ],
    volumes,
    { spread: c.api.replicaCount > 1 },
  );
  const out: K8sObject[] = [
    serviceAccount(k, w),
    service(k, SERVICES.api, w, [{ name: "http", port: k.plan.ports.api }]),
  ];
  if (sqlite)
    out.push(
      new PersistentVolumeClaim({
        metadata: k.meta(`${w.name}-db`, w),
        spec: {
          accessModes: ["ReadWriteOnce"],
          ...(c.kubernetes.nats.storageClassName
            ? { storageClassName: c.kubernetes.nats.storageClassName }
            : {}),
          resources: { requests: { storage: "1Gi" } },
        },
      }),
    );
  // one SQLite writer: the old pod stops before the new one opens the file
  out.push(deployment(k, w, spec, { replicas: c.api.replicaCount, recreate: sqlite }));
  if (c.api.replicaCount > 1) out.push(pdb(k, w));
  return out;
}
