-- 0002: cluster membership (package cluster/membership; persist/postgres
-- cluster.go). partition_lease comes from 0001: owner '' means released.

-- One row per member node: the incarnation (process start) that runs it, its
-- addresses, and a lease renewed by heartbeats (database clock). Expired rows
-- are deleted by any member's heartbeat.
CREATE TABLE cluster_member (
  node_id      TEXT PRIMARY KEY,
  incarnation  TEXT        NOT NULL UNIQUE,
  cluster_addr TEXT        NOT NULL,
  api_addr     TEXT        NOT NULL,
  leaving      BOOLEAN     NOT NULL DEFAULT false,
  lease_until  TIMESTAMPTZ NOT NULL,
  joined_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The single version row: bumped in the same transaction as every change of
-- the member set, so one version means one ring on every node. Every
-- membership transaction locks it (FOR UPDATE; Acquire FOR SHARE), which
-- orders them.
CREATE TABLE cluster_version (
  id      BOOLEAN PRIMARY KEY DEFAULT true CHECK (id),
  version BIGINT  NOT NULL
);
INSERT INTO cluster_version (id, version) VALUES (true, 0);
