# edge-agent: the front door. `make demo` and `make test` are the quick start.
GO        ?= go
BIN       := bin
# The tests run with the fault hooks compiled in (internal/failpoint); the
# binaries `make build` makes have none.
TESTFLAGS ?= -race -count=1 -timeout 15m -tags failpoints

# Pinned tool versions (make check).
STATICCHECK_VERSION := v0.8.2
TOOLS               := $(CURDIR)/.tools

.PHONY: all build demo test bench chaos chaos-mutants check fmt vet staticcheck plugins clean

all: build

build: plugins
	$(GO) build -o $(BIN)/edge-agent ./cmd/edge-agent
	$(GO) build -o $(BIN)/edgectl ./cmd/edgectl
	$(GO) build -o $(BIN)/firmware-sim ./firmware-sim

-include Makefile.plugins

# The story of a stale controller, told on the terminal in under a minute:
# embedded broker + firmware simulator + agent, no broker installed. Only
# the Go plugins are built for it (Go is all a fresh machine needs).
demo: $(addprefix $(PLUGINS_DIR)/,$(addsuffix .wasm,$(PLUGINS_GO)))
	$(GO) run ./cmd/edge-demo

# Every guarantee, against real mosquitto, etcd, bbolt files and .wasm
# built from source (.ci/run installs them on a fresh Debian machine).
test:
	$(GO) vet ./...
	$(GO) vet -tags failpoints ./...
	$(GO) test $(TESTFLAGS) ./...

# The chaos campaign (docs/testing.md, "Chaos campaign"): real processes,
# a seeded schedule of faults, a history checked by a porcupine model and
# against the firmware's journal. Exit 1 when it found a violation.
#   make chaos SEED=42 DURATION=30m            mosquitto with persistence
#   make chaos SEED=42 DURATION=5m BROKER=embedded
SEED     ?= 1
DURATION ?= 5m
BROKER   ?= mosquitto
chaos:
	$(GO) build -o $(BIN)/edge-chaos ./cmd/edge-chaos
	$(BIN)/edge-chaos run -seed $(SEED) -duration $(DURATION) -broker $(BROKER) $(CHAOSFLAGS)

# Every deliberate bug of internal/mutant, each built into an agent of its
# own and run against a fixed-seed campaign: prints `caught K/6`, exit 0
# only when every mutant was caught. (make test runs it too with
# CHAOS_MUTANTS=1.)
chaos-mutants:
	$(GO) build -o $(BIN)/edge-chaos ./cmd/edge-chaos
	$(BIN)/edge-chaos mutants -seed $(SEED) -duration 60s -settle 30s $(CHAOSFLAGS)

# Benchmarks: end-to-end harness (BENCHMARKS.md) and go test -bench.
bench:
	$(GO) test -run XXX -bench . -benchtime 2s ./internal/store ./internal/policy
	$(GO) run ./cmd/edge-bench

# fmt, vet, staticcheck (pinned) over both modules, then the tests.
check: fmt vet staticcheck test

$(TOOLS)/staticcheck-$(STATICCHECK_VERSION):
	GOBIN=$(TOOLS)/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(TOOLS)/bin/staticcheck $@

staticcheck: $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)
	$< ./...
	cd plugins/sdk && $< ./...
	cd plugins/sdk && GOOS=wasip1 GOARCH=wasm $< ./...

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	cd plugins/sdk && $(GO) vet ./...

clean:
	rm -rf $(BIN) plugins/build data .demo $(TOOLS)
