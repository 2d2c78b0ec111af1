# Local stand-in for the official golang:1.23-bookworm image, built FROM a debootstrapped
# Debian root filesystem (scripts/provision.sh passes BASE) because no registry is reachable.
# Go 1.23 comes from bookworm-backports (Debian 13 has only 1.24); the backports archive is the
# base's own Debian mirror.
ARG BASE=llm-sandbox-base:trixie
FROM ${BASE}
ENV LANG=C.UTF-8
# Same layout as the official image: Go under /usr/local/go, a world-writable GOPATH at /go,
# and GOTOOLCHAIN=local so a go.mod never makes `go` try to download another toolchain.
RUN set -eux; \
    mirror=$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list); \
    printf 'deb %s bookworm-backports main\n' "$mirror" > /etc/apt/sources.list.d/backports.list; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends -t bookworm-backports \
        golang-1.23-go; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        git tar ca-certificates gcc libc6-dev make pkg-config; \
    rm /etc/apt/sources.list.d/backports.list; \
    ln -s /usr/lib/go-1.23 /usr/local/go; \
    mkdir -p /go/src /go/bin; \
    chmod -R 1777 /go; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    /usr/local/go/bin/go version
ENV GOTOOLCHAIN=local \
    GOPATH=/go \
    PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /go
CMD ["bash"]
