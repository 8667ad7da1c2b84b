# sequencer: build, test, generate. `make help` lists the targets.
GO      ?= go
BIN     := bin
PKGS    := ./...
# The version `sequencer version` and sequencer_build_info report: the newest
# v* tag (git describe), else "dev"; the commit is HEAD (-dirty with local changes).
VERSION ?= $(shell git describe --tags --match 'v*' --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
LDFLAGS := -X github.com/sequencer-im/sequencer/buildinfo.version=$(VERSION) -X github.com/sequencer-im/sequencer/buildinfo.commit=$(COMMIT)
# Packages that hold no cgo-free races to skip; -race runs everywhere.
TESTFLAGS ?= -race -count=1 -timeout 60m

.PHONY: availability help build run test test-short test-ts test-console lint proto proto-check model bench bench-micro clean image image-test deploy-check grpc-tools soak

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build bin/sequencer and bin/sequencer-bench (version and commit stamped, see VERSION)
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/sequencer ./cmd/sequencer
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/sequencer-bench ./cmd/sequencer-bench

# `run` builds only bin/sequencer (not the benchmark tool): a first `make run`
# compiles what it runs and nothing more (README "Quick start" measures it).
run: ## build bin/sequencer and run one node on the embedded store under ./data (127.0.0.1:7070)
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/sequencer ./cmd/sequencer
	./$(BIN)/sequencer serve

test: build ## all tests (PostgreSQL ones included; see README), with the race detector
	$(GO) test $(TESTFLAGS) $(PKGS)

test-ts: ## the TypeScript client's tests against real nodes (npm ci, Node >= 20; clients/typescript/test.sh)
	bash clients/typescript/test.sh

test-console: build ## the web console in headless Chromium against a 3-node cluster under load, with a kill -9, and its live conversation view (needs chromium and PostgreSQL)
	SEQUENCER_BROWSER_TESTS=1 $(GO) test -count=1 -v -run 'TestConsole(ShowsFailover|TailsLive)' ./e2e/

lint: ## gofmt check + go vet
	@out=$$(gofmt -l $$(git ls-files '*.go') 2>/dev/null); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

proto: ## regenerate proto/ Go code with protoc and the plugin versions pinned in go.mod
	@command -v protoc >/dev/null || { echo "protoc missing: apt-get install -y protobuf-compiler"; exit 1; }
	$(GO) build -o $(BIN)/ tool
	protoc -I proto \
	  --plugin=protoc-gen-go=$(BIN)/protoc-gen-go \
	  --plugin=protoc-gen-connect-go=$(BIN)/protoc-gen-connect-go \
	  --go_out=proto --go_opt=paths=source_relative \
	  --connect-go_out=proto --connect-go_opt=paths=source_relative \
	  proto/sequencer/v1/sequencer.proto proto/cluster/v1/cluster.proto

proto-check: proto ## fail when committed generated code differs from `make proto`
	@git diff --exit-code -- proto/ || { echo "generated code is stale: run make proto and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- proto/)" || { git status --porcelain -- proto/; echo "untracked generated files: run make proto and commit"; exit 1; }

model: ## spin model check of the ownership protocol, both fencing variants, and every mutant (model/check.sh, docs/TESTING.md)
	bash model/check.sh

# `make bench` is a short version of docs/BENCHMARKS.md's run (every engine:
# the seed's baselines, the in-process engines and, through bin/sequencer, the
# network ones, on PostgreSQL and SQLite; every scenario, 5 s each, 200,000
# conversations in the memory scenario).
# Needs PostgreSQL at 127.0.0.1:5432 (user postgres) and Redis at 127.0.0.1:6379.
BENCH_FLAGS  ?= --duration 5s --warmup 1s --memory-convs 200000
BENCH_REPORT ?= bench-results/bench.md

bench: build ## short benchmark run of every engine and scenario, report in bench-results/ (see docs/BENCHMARKS.md)
	./$(BIN)/sequencer-bench $(BENCH_FLAGS) --report $(BENCH_REPORT)

bench-micro: ## Go micro-benchmarks (msg_id generator)
	$(GO) test -run '^$$' -bench . -benchtime 2s ./idgen/

AVAIL_HOLD ?= 5s
AVAIL_FAULTS ?=
availability: ## issue 30's availability runs: each network fault on n1 of 3, then a control row without one (or AVAIL_FAULTS; none is the control), for AVAIL_HOLD (5s; 30s), raw JSON and SDK clients (docs/TESTING.md "Availability")
	SEQUENCER_AVAILABILITY=1 AVAIL_HOLD=$(AVAIL_HOLD) AVAIL_FAULTS=$(AVAIL_FAULTS) $(GO) test -count=1 -v -timeout 60m -run '^TestAvailability$$' ./e2e/

SOAK_MINUTES ?= 10
SOAK_SEED ?=
soak: ## random nemesis schedules for SOAK_MINUTES (default 10) on 3 nodes; prints SOAK_SEED, which reproduces the schedule (docs/TESTING.md "Soak")
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_SEED=$(SOAK_SEED) $(GO) test -count=1 -v -timeout $$(( $(firstword $(subst ., ,$(SOAK_MINUTES))) * 5 / 4 + 25 ))m -run '^TestNemesisSchedule$$' ./e2e/

image: ## container image localhost/sequencer:dev FROM scratch with podman (deploy/Containerfile)
	bash scripts/image.sh

image-test: ## build the image and run it on PostgreSQL and on a volume (scripts/image-test.sh)
	bash scripts/image-test.sh

deploy-check: ## validate deploy/ (promtool, compose config, systemd-analyze) and run a real Prometheus against real nodes
	bash scripts/deploy-check.sh

grpc-tools: ## install grpcurl and grpc-health-probe (pinned, go install) into bin/grpc-tools for the e2e tests (scripts/grpc-tools.sh)
	bash scripts/grpc-tools.sh

clean:
	rm -rf $(BIN)
