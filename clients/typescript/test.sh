#!/usr/bin/env bash
# Tests of the TypeScript client against real nodes: builds bin/sequencer,
# installs the locked dependencies (npm ci), checks that the committed
# generated code is current, then runs test/*.test.ts (node:test). Needs
# Node >= 20 with npm, protoc, and PostgreSQL at 127.0.0.1:5432 (or
# $SEQUENCER_TEST_DATABASE_URL) for the cluster cases. `make test-ts` runs it;
# .ci/run calls it after `make test`.
set -euo pipefail
cd "$(dirname "$0")"
export PATH=/usr/local/go/bin:$PATH

if ! command -v npm >/dev/null; then
  echo "node/npm missing: installing Debian's nodejs and npm"
  (apt-get update -qq && apt-get install -y -qq nodejs npm) >/dev/null
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "the TypeScript client's tests need Node >= 20, found $(node --version)"; exit 1
fi

(cd ../.. && go build -o bin/sequencer ./cmd/sequencer)
npm ci --no-audit --no-fund --loglevel=error

npm run --silent generate
git diff --exit-code -- src/gen || { echo "clients/typescript/src/gen is stale: run npm run generate and commit"; exit 1; }
test -z "$(git status --porcelain -- src/gen)" || { git status --porcelain -- src/gen; echo "untracked generated files: run npm run generate and commit"; exit 1; }

SEQUENCER_BIN="$(cd ../.. && pwd)/bin/sequencer" npm test
