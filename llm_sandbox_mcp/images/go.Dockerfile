# Project image for Go: the configured base image (the official golang image by default) plus a pre-built
# standard library. The runner needs only the go toolchain and CA certificates, which the official image has;
# without the pre-built cache every build in a fresh sandbox compiles the standard packages it imports first
# (3.5 s for "fmt" on an idle 2-core machine, against 0.1 s with it). go_run.sh uses it read-only.
ARG BASE=golang:1.23-bookworm
FROM ${BASE}
USER root
RUN set -eux; \
    export GOCACHE=/opt/llm-sandbox/go-cache GOTOOLCHAIN=local GOFLAGS=; \
    go build std; \
    chmod -R a+rX /opt/llm-sandbox/go-cache
