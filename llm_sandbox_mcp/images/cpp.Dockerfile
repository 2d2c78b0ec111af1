# Project image for C++: the configured base image (the official gcc image, Debian-based, by default) plus
# the header-only libraries in cpp.txt and CA certificates for library downloads.
ARG BASE=gcc:14
FROM ${BASE}
USER root
COPY cpp.txt /tmp/llm-sandbox-mcp/cpp.txt
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        $(sed 's/#.*//' /tmp/llm-sandbox-mcp/cpp.txt) ca-certificates; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/* /tmp/llm-sandbox-mcp
