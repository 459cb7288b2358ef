# edge-agent: the front door. `make demo` and `make test` are the quick start.
GO        ?= go
BIN       := bin
DIST      := dist
# The tests run with the fault hooks compiled in (internal/failpoint); the
# binaries `make build` makes have none.
TESTFLAGS ?= -race -count=1 -timeout 15m -tags failpoints

# What a build says it is (`edge-agent version`, the tarballs' and the
# package's names). VERSION is the newest v* tag (without the v) when the
# checkout has one, else 0.1.0-dev; COMMIT is HEAD; DATE is HEAD's commit
# time in UTC, not the time of the build, so the same commit builds the
# same bytes. Any of them can be given: make dist VERSION=1.2.0.
VERSION ?= $(or $(patsubst v%,%,$(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null)),0.1.0-dev)
COMMIT  ?= $(or $(shell git rev-parse --short=12 HEAD 2>/dev/null),unknown)
DATE    ?= $(or $(shell TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null),unknown)
SOURCE_DATE_EPOCH ?= $(or $(shell git log -1 --format=%ct 2>/dev/null),0)

# Static binaries: no cgo, no build paths, no symbol tables; the version
# injected into each command's main package.
LDFLAGS := -s -w -X main.Version=$(VERSION) -X main.Commit=$(COMMIT) -X main.Date=$(DATE)
GOBUILD := CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)"

# The three programs, by binary name and package.
CMDS := edge-agent:./cmd/edge-agent edgectl:./cmd/edgectl firmware-sim:./firmware-sim
# make dist's platforms: OS/ARCH[/GOARM].
PLATFORMS := linux/amd64 linux/arm64 linux/arm/7

.PHONY: all build binaries demo test bench chaos chaos-mutants check fmt vet staticcheck plugins clean dist

# Pinned tool versions (make check).
STATICCHECK_VERSION := v0.8.2
TOOLS               := $(CURDIR)/.tools


all: build

build: plugins binaries

binaries:
	$(foreach c,$(CMDS),$(GOBUILD) -o $(BIN)/$(word 1,$(subst :, ,$(c))) $(word 2,$(subst :, ,$(c))) &&) true

-include Makefile.plugins
-include Makefile.release

# The story of a stale controller, told on the terminal in under a minute:
# embedded broker + firmware simulator + agent, no broker installed. Only
# the Go plugins are built for it (Go is all a fresh machine needs).
demo: $(addprefix $(PLUGINS_DIR)/,$(addsuffix .wasm,$(PLUGINS_GO)))
	$(GO) run ./cmd/edge-demo

# Every guarantee, against real mosquitto, etcd, bbolt files and .wasm
# built from source (.ci/run installs them on a fresh Debian machine). The
# C plugin is built here unconditionally: without clang this fails, as it
# should in CI. packaging/ (the Debian package, a module of its own) is
# tested too, without -race: it has no concurrency of its own, and nfpm's
# compression under the race detector takes minutes. controller/ (the
# controller SDK, a module of its own) runs its own unit tests and
# examples; its tests against etcd, mosquitto and the agent are
# internal/controllertest, in the agent's module.
test: plugins-c
	$(GO) vet ./...
	$(GO) vet -tags failpoints ./...
	$(GO) test $(TESTFLAGS) ./...
	cd controller && $(GO) vet ./... && $(GO) test $(TESTFLAGS) ./...
	cd packaging && $(GO) vet ./... && $(GO) test -count=1 -timeout 15m ./...

# The chaos campaign (docs/testing.md, "Chaos campaign"): real processes,
# a seeded schedule of faults, a history checked by a porcupine model and
# against the firmware's journal. Exit 1 when it found a violation.
#   make chaos SEED=42 DURATION=30m            mosquitto with persistence
#   make chaos SEED=42 DURATION=5m BROKER=embedded
#   make chaos SEED=1 DURATION=5m HA=1         a standby pair (docs/testing.md)
#   make chaos SEED=1 DURATION=5m FLEET=3      three gateways on a 3-node NATS cluster
SEED     ?= 1
DURATION ?= 5m
BROKER   ?= mosquitto
HA       ?=
FLEET    ?=
chaos:
	$(GO) build -o $(BIN)/edge-chaos ./cmd/edge-chaos
	$(BIN)/edge-chaos run -seed $(SEED) -duration $(DURATION) $(if $(FLEET),-fleet $(FLEET) -broker nats,-broker $(BROKER)) $(if $(filter 1,$(HA)),-ha) $(CHAOSFLAGS)

# Every deliberate bug (the patches in cmd/edge-chaos/mutants/), each built
# into an agent of its own (go build -overlay: the tree is not changed) and
# run against a fixed-seed campaign (the pair's, ha_*, with -ha): prints
# `caught K/8`, exit 0 only when every mutant was caught. (make test runs
# it too with CHAOS_MUTANTS=1.)
chaos-mutants:
	$(GO) build -o $(BIN)/edge-chaos ./cmd/edge-chaos
	$(BIN)/edge-chaos mutants -seed $(SEED) -duration 60s -settle 30s $(CHAOSFLAGS)

# Benchmarks: end-to-end harness (BENCHMARKS.md) and go test -bench. The
# takeover runs (-takeover: 20 per session_ttl and fault, a pair of agents
# each time) take about 12 minutes of the total.
bench:
	$(GO) test -run XXX -bench . -benchtime 2s ./internal/store ./internal/policy ./internal/agent ./internal/auth
	cd controller && $(GO) test -run XXX -bench . -benchtime 2s ./wire/jws
	$(GO) run ./cmd/edge-bench
	$(GO) run ./cmd/edge-bench -footprint-plugins
	$(GO) run ./cmd/edge-bench -fleet -fleet-gateways 1,5,20 -fleet-devices 16 -fleet-broker mosquitto,nats -duration 10s
	$(GO) run ./cmd/edge-bench -takeover -takeover-runs 20 -session-ttl 3s,10s -devices 64 -duration 10s

# fmt, vet, staticcheck (pinned) over every module, then the tests.
check: fmt vet staticcheck test

$(TOOLS)/staticcheck-$(STATICCHECK_VERSION):
	GOBIN=$(TOOLS)/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(TOOLS)/bin/staticcheck $@

staticcheck: $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)
	$< ./...
	cd controller && $< ./...
	cd plugins/sdk && $< ./...
	cd plugins/sdk && GOOS=wasip1 GOARCH=wasm $< ./...

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	cd controller && $(GO) vet ./...
	cd plugins/sdk && $(GO) vet ./...
	cd packaging && $(GO) vet ./...

clean:
	rm -rf $(BIN) $(DIST) plugins/build data .demo $(TOOLS)
