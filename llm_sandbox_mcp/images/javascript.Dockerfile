# Project image for JavaScript: the configured base image (the official node image by default) plus a few
# utility packages, pinned in javascript.txt, in /node_modules where both require() and import look.
ARG BASE=node:22-slim
FROM ${BASE}
USER root
ARG NPM_CONFIG_REGISTRY
COPY javascript.txt /tmp/llm-sandbox-mcp/javascript.txt
RUN set -eux; \
    if [ -z "${NPM_CONFIG_REGISTRY:-}" ]; then unset NPM_CONFIG_REGISTRY; fi; \
    cd /; \
    npm install --prefix / --no-audit --no-fund --no-update-notifier --omit=dev --loglevel=error \
        $(sed 's/#.*//' /tmp/llm-sandbox-mcp/javascript.txt); \
    rm -rf /package.json /package-lock.json /tmp/llm-sandbox-mcp /root/.npm; \
    node -e "require('lodash')"
