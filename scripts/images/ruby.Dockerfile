# Local stand-in for the official ruby:3.3-slim image, built FROM a debootstrapped
# Debian root filesystem (scripts/provision.sh passes BASE) because no registry is reachable.
ARG BASE=llm-sandbox-base:trixie
FROM ${BASE}
ENV LANG=C.UTF-8
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ruby tar; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*
CMD ["irb"]
