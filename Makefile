# Rolter. `make run` starts a simulated fleet behind the gateway; `make test` runs every test.
GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
SUDO      := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PKGS      := ./...
FUZZTIME  ?= 10s

# bash, so that a pipeline fails when go test does (pipefail).
SHELL       := /bin/bash
.SHELLFLAGS := -o pipefail -c

# staticcheck serves the lint step, not the gateway: `go install pkg@version` builds the pinned release into
# TOOLS, outside the repository and go.mod, once per Go version (a binary built by an older Go refuses newer
# code), and every later `make lint` on the machine reuses it.
STATICCHECK_VERSION ?= v0.8.2
TOOLS       ?= $(HOME)/.cache/rolter-tools
STATICCHECK := $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)-$(shell $(GO) env GOVERSION)/staticcheck
# kube-apiserver serves internal/kubetest: built once from the nested module internal/tools/kubeapiserver,
# which pins it outside the gateway's go.mod; the tests find it through ROLTER_KUBE_APISERVER.
KUBE_VERSION   ?= v1.35.4
KUBE_APISERVER := $(TOOLS)/kube-apiserver-$(KUBE_VERSION)-$(shell $(GO) env GOVERSION)/kube-apiserver
export ROLTER_KUBE_APISERVER := $(KUBE_APISERVER)

export ROLTER_REQUIRE_SDK := 1
export ROLTER_REQUIRE_BROWSER := 1
export ROLTER_REQUIRE_POSTGRES := 1
export ROLTER_REQUIRE_HAPROXY := 1
export ROLTER_REQUIRE_NATS := 1
export ROLTER_REQUIRE_DNSMASQ := 1
export ROLTER_REQUIRE_NETNS := 1

.PHONY: all deps deps-build deps-test test-modules FORCE build image run test test-unit test-race test-nocgo test-valgrind valgrind bench bench-routing bench-overhead bench-instructions bench-ab bench-scaleout fuzz-short lint fmt vet clean bench-pressure

all: build

# APT installs Debian packages, as root or with sudo.
APT := $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq

# deps installs what a fresh Debian machine lacks: deps-build what the gateway's build needs, deps-test the
# tools only the tests use.
deps: deps-build deps-test

# deps-build: libzmq and pkg-config, for the cgo binding of the KV-event subscriber.
deps-build:
	@if ! pkg-config --exists libzmq 2>/dev/null; then \
		echo "deps: installing libzmq3-dev and pkg-config with apt"; \
		$(APT) libzmq3-dev pkg-config >/dev/null; \
	fi

# deps-test: Node.js, npm and the openai npm package for the real-client test, Chromium for the
# dashboard's browser test, HAProxy for the scale-out test, nats-server for the cluster tests, PostgreSQL's
# server for the shared-store tests (they start their own servers; the package's own cluster is not used)
# and valgrind for the instruction count's test; etcd, kube-apiserver (built once), dnsmasq and iproute2 for
# the discovery tests.
deps-test:
	@if ! command -v node >/dev/null 2>&1; then \
		echo "deps: installing nodejs and npm with apt"; \
		$(APT) nodejs npm >/dev/null; \
	fi
	@if [ ! -d engine/testdata/sdk/node_modules/openai ]; then \
		echo "deps: installing the openai npm package for the SDK test"; \
		cd engine/testdata/sdk && npm ci --no-audit --no-fund --silent; \
	fi
	@if [ ! -x /usr/bin/chromium ]; then \
		echo "deps: installing chromium with apt for the dashboard's browser test"; \
		$(APT) chromium >/dev/null; \
	fi
	@if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then \
		echo "deps: installing haproxy with apt for the scale-out test"; \
		$(APT) haproxy >/dev/null; \
	fi
	@if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then \
		echo "deps: installing nats-server with apt for the cluster tests"; \
		$(APT) nats-server >/dev/null; \
	fi
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		echo "deps: installing postgresql with apt for the PostgreSQL store tests"; \
		$(APT) postgresql >/dev/null; \
	fi
	@if [ ! -x /usr/bin/etcd ] || [ ! -x /usr/sbin/dnsmasq ] || ! command -v ip >/dev/null 2>&1; then \
		echo "deps: installing etcd-server, dnsmasq-base and iproute2 with apt for the discovery tests"; \
		$(APT) etcd-server dnsmasq-base iproute2 >/dev/null; \
	fi
	@$(MAKE) --no-print-directory valgrind kube-apiserver

build: deps-build
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/rolter ./cmd/rolter

run: build
	./bin/rolter up

# image assembles the container image from bin/rolter without a registry or a container engine
# (deploy/image): an OCI layout in bin/image and a docker archive, bin/rolter-image.tar, tagged
# rolter:$(VERSION). Load it with `podman load -i`, `docker load -i` or `kind load image-archive`.
image: build
	cd deploy/image && $(GO) run . -binary $(CURDIR)/bin/rolter -version $(VERSION) -layout $(CURDIR)/bin/image -tar $(CURDIR)/bin/rolter-image.tar

# test is what CI runs (.ci/run): vet, formatting and staticcheck, the race-enabled suite, the no-cgo
# build, the instruction count's test (it runs the gateway under valgrind and so cannot run under the race
# detector), and the nested modules' tests (deploy/: the chart, the image), whose tools stay out of the
# gateway's go.mod. Each package's line shows as it finishes (bin/testprogress reads go test -json).
NESTED := deploy/helm deploy/image control/webtest
test: deps
	@echo "== make test: lint"; $(MAKE) --no-print-directory lint
	@echo "== make test: the suite with the race detector"; $(MAKE) --no-print-directory test-race
	@echo "== make test: without cgo"; $(MAKE) --no-print-directory test-nocgo
	@echo "== make test: instructions under valgrind"; $(MAKE) --no-print-directory test-valgrind
	@echo "== make test: nested modules"; $(MAKE) --no-print-directory test-modules

bin/testprogress: FORCE
	@$(GO) build -o $@ ./internal/cmd/testprogress

FORCE:

test-valgrind: valgrind bin/testprogress
	$(GO) test -count=1 -json -run '^TestInstructions' ./bench/instructions | bin/testprogress

valgrind:
	@if ! command -v valgrind >/dev/null 2>&1 || ! command -v cg_diff >/dev/null 2>&1; then \
		echo "installing valgrind with apt"; \
		$(APT) valgrind >/dev/null; \
	fi

test-unit: bin/testprogress
	$(GO) test -count=1 -timeout 10m -json $(PKGS) | bin/testprogress

test-race: bin/testprogress
	$(GO) test -race -count=1 -timeout 12m -json $(PKGS) | bin/testprogress

# Without cgo there is no ZMQ: everything else must still build and pass, and kv_events configs are refused.
test-nocgo: bin/testprogress
	CGO_ENABLED=0 $(GO) build ./...
	CGO_ENABLED=0 $(GO) test -count=1 -short -timeout 10m -json $(PKGS) | bin/testprogress

test-modules: bin/testprogress
	@for m in $(NESTED); do \
		echo "== $$m"; \
		(cd $$m && $(GO) vet ./... && $(GO) test -count=1 -timeout 10m -json ./... | $(CURDIR)/bin/testprogress) || exit 1; \
	done

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# Routing quality of every strategy on simulated fleets (bench/results/routing.md, ~4 min).
bench-routing:
	$(GO) run ./bench/cmd/routing -out bench/results

# Gateway overhead against direct, HAProxy and two null proxies (bench/cmd/refproxy), small-body and
# cache_aware 8 KiB cases (bench/results/overhead.md, ~6.5 min).
bench-overhead:
	@if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then \
		echo "bench-overhead: installing haproxy with apt"; \
		$(APT) haproxy >/dev/null; \
	fi
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/rolter ./cmd/rolter
	$(GO) build -o bin/fakeupstream ./bench/cmd/fakeupstream
	$(GO) build -o bin/refproxy ./bench/cmd/refproxy
	$(GO) run ./bench/cmd/overhead -rolter bin/rolter -upstream bin/fakeupstream -refproxy bin/refproxy -out bench/results

# Instructions per proxied request of `rolter serve` under valgrind (cachegrind), in the overhead report's
# two cases: the same count for the same binary whatever the machine does (bench/results/instructions.md, ~1 min).
bench-instructions: valgrind
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/rolter ./cmd/rolter
	$(GO) build -o bin/fakeupstream ./bench/cmd/fakeupstream
	$(GO) build -o bin/refproxy ./bench/cmd/refproxy
	$(GO) run ./bench/cmd/instructions -rolter bin/rolter -upstream bin/fakeupstream -refproxy bin/refproxy -out bench/results

# A/B of the gateway's c=64 throughput and CPU per request: the tree against git revision BASE (HEAD~1),
# in the overhead report's CASE (small or cache_aware), each build started afresh in each of 6 alternating
# rounds; prints medians and rounds (~2 min small, ~5 min cache_aware).
BASE ?= HEAD~1
CASE ?= small
bench-ab:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/rolter ./cmd/rolter
	$(GO) build -o bin/fakeupstream ./bench/cmd/fakeupstream
	$(GO) run ./bench/cmd/ab -base $(BASE) -b bin/rolter -upstream bin/fakeupstream -case $(CASE)

# Scale-out: 1, 2 and 4 `rolter serve` processes behind HAProxy in TCP mode on one simulated fleet
# (bench/results/scaleout.md, ~10 min).
# Routing under KV pressure: every strategy on 4 simulated engines whose KV holds 25/50/100% of each
# workload's working set, the Mooncake trace among them (bench/results/pressure.md, ~17 min).
bench-pressure:
	$(GO) run ./bench/cmd/pressure -out bench/results

bench-scaleout:
	@if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then \
		echo "bench-scaleout: installing haproxy with apt"; \
		$(APT) haproxy >/dev/null; \
	fi
	@if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then \
		echo "bench-scaleout: installing nats-server with apt"; \
		$(APT) nats-server >/dev/null; \
	fi
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/rolter ./cmd/rolter
	$(GO) run ./bench/cmd/scaleout -rolter bin/rolter -out bench/results

fuzz-short:
	@for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list 'Fuzz.*' $$pkg 2>/dev/null | grep '^Fuzz'); do \
			echo "fuzz $$pkg $$f ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; \
	done

lint: vet $(STATICCHECK)
	@out=$$(gofmt -s -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt -s needed:"; echo "$$out"; exit 1; fi
	$(STATICCHECK) $(PKGS)

kube-apiserver: $(KUBE_APISERVER)

$(KUBE_APISERVER):
	@echo "== building kube-apiserver $(KUBE_VERSION) for the Kubernetes tests, once per Go version (about 7 minutes on 2 cores)"
	cd internal/tools/kubeapiserver && $(GO) build -o $@ k8s.io/kubernetes/cmd/kube-apiserver

$(STATICCHECK):
	GOBIN=$(dir $@) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -s -w .

clean:
	rm -rf bin

# The suite's Kubernetes tests need kube-apiserver; under make test they fail, rather than skip, without it.
test-unit test-race test-nocgo: kube-apiserver
test: export ROLTER_REQUIRE_KUBE := 1
