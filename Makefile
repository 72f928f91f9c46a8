# Better Compute — developer targets. `make help` lists them.
SHELL := /bin/bash
GO    ?= go
BIN   := $(CURDIR)/bin

.PHONY: help
help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-10s %s\n", $$1, $$2}'

GENERATORS := $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-connect-go $(BIN)/protoc-gen-go-grpc $(BIN)/templ

$(GENERATORS) &: tools/go.mod tools/go.sum
	cd tools && $(GO) build -o $(BIN)/ github.com/bufbuild/buf/cmd/buf google.golang.org/protobuf/cmd/protoc-gen-go \
		connectrpc.com/connect/cmd/protoc-gen-connect-go google.golang.org/grpc/cmd/protoc-gen-go-grpc \
		github.com/a-h/templ/cmd/templ

.PHONY: tools
tools: $(GENERATORS) ## build the pinned code generators into bin/

.PHONY: generate
generate: tools ## regenerate gen/ from proto/ and the console's *_templ.go from *.templ (offline, pinned tools)
	$(BIN)/buf lint
	rm -rf gen
	$(BIN)/buf generate --template buf.gen.yaml
	$(BIN)/buf generate --template buf.gen.agent.yaml
	$(BIN)/buf generate --template buf.gen.driver.yaml
	$(BIN)/templ generate -path internal/console

.PHONY: build
build: ## build the programs under cmd/ into bin/
	$(GO) build -o $(BIN)/ ./cmd/...

.PHONY: test
test: ## run the test suite (SQLite; PostgreSQL too when BC_TEST_POSTGRES_URL is set)
	$(GO) test ./...

.PHONY: lint
lint: $(BIN)/golangci-lint ## go vet, gofmt and golangci-lint (pinned in tools/go.mod)
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(BIN)/golangci-lint run ./...

$(BIN)/golangci-lint: tools/go.mod tools/go.sum
	cd tools && $(GO) build -o $(BIN)/ github.com/golangci/golangci-lint/v2/cmd/golangci-lint

.PHONY: bench
bench: ## run the Go benchmarks
	$(GO) test -run '^$$' -bench . -benchmem ./...

# bcd's container image. IMAGE_CGO=1 (the default) builds bcd with cgo so
# the nvml backend works, and packs glibc from this host beside it;
# IMAGE_CGO=0 builds a static bcd without NVML (fake hardware only).
IMAGE     ?= better-compute/bcd:latest
IMAGE_CGO ?= 1

.PHONY: image
image: ## build bcd's container image into bin/bcd-image.tar (OCI archive; podman load, docker load or ctr import it)
	mkdir -p $(BIN)/image
	CGO_ENABLED=$(IMAGE_CGO) $(GO) build -trimpath -ldflags "-s -w -X main.version=$$(git describe --always --dirty 2>/dev/null || echo dev)" \
		-o $(BIN)/image/bcd ./cmd/bcd
	$(GO) run ./hack/mkimage -o $(BIN)/bcd-image.tar -name $(IMAGE) -entrypoint /usr/local/bin/bcd \
		$(if $(filter 1,$(IMAGE_CGO)),-libs) -add $(BIN)/image/bcd:/usr/local/bin/bcd

.PHONY: sample-image
sample-image: ## build the sample deployable disk image into bin/sample-image (deploy/images/build-sample.sh)
	deploy/images/build-sample.sh $(BIN)/sample-image

.PHONY: ramdisk
ramdisk: ## build the commissioning ramdisk (Debian kernel, busybox, bcd) into .cache/ramdisk/out (tools/ramdisk/build.sh)
	tools/ramdisk/build.sh
.PHONY: guest-image
guest-image: ## build the instance guest image into bin/guest-image (tools/guest-image/build.sh; root, network; cached)
	tools/guest-image/build.sh $(BIN)/guest-image

.PHONY: dev
dev: ## run better-compute dev (all roles, SQLite in ./.better-compute)
	$(GO) run ./cmd/better-compute dev
