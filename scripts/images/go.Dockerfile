# Local stand-in for the official golang:1.23-bookworm image, built FROM a debootstrapped
# Debian root filesystem (scripts/provision.sh passes BASE) because no registry is reachable.
ARG BASE=llm-sandbox-base:trixie
FROM ${BASE}
ENV LANG=C.UTF-8
# Same layout as the official image: Go under /usr/local/go, a world-writable GOPATH at /go,
# and GOTOOLCHAIN=local so a go.mod never makes `go` try to download another toolchain.
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        golang-go git tar ca-certificates; \
    ln -s "$(readlink -f /usr/lib/go)" /usr/local/go; \
    mkdir -p /go/src /go/bin; \
    chmod -R 1777 /go; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*
ENV GOTOOLCHAIN=local \
    GOPATH=/go \
    PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /go
CMD ["bash"]
