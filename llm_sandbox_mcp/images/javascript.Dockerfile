# Project image for JavaScript: the configured base image (the official node image by default) plus a few
# utility packages, pinned in javascript.txt. They are installed under /opt and linked as /node_modules,
# where both require() and import look from /workspace (npm cannot install into / itself).
ARG BASE=node:22-slim
FROM ${BASE}
USER root
ARG NPM_CONFIG_REGISTRY
# install-ca.pem: SANDBOX_INSTALL_CA_BUNDLE (TLS-inspecting proxies), trusted by this step only.
COPY javascript.txt install-ca.pem /tmp/llm-sandbox-mcp/
RUN set -eux; \
    if [ -s /tmp/llm-sandbox-mcp/install-ca.pem ]; then \
        export SSL_CERT_FILE=/tmp/llm-sandbox-mcp/install-ca.pem PIP_CERT=/tmp/llm-sandbox-mcp/install-ca.pem \
            REQUESTS_CA_BUNDLE=/tmp/llm-sandbox-mcp/install-ca.pem NODE_EXTRA_CA_CERTS=/tmp/llm-sandbox-mcp/install-ca.pem; \
    fi; \
    if [ -z "${NPM_CONFIG_REGISTRY:-}" ]; then unset NPM_CONFIG_REGISTRY; fi; \
    mkdir -p /opt/llm-sandbox-mcp/node; \
    cd /opt/llm-sandbox-mcp/node; \
    npm install --no-audit --no-fund --no-update-notifier --omit=dev --loglevel=error \
        $(sed 's/#.*//' /tmp/llm-sandbox-mcp/javascript.txt); \
    ln -s /opt/llm-sandbox-mcp/node/node_modules /node_modules; \
    rm -rf /tmp/llm-sandbox-mcp /root/.npm; \
    cd /tmp; node -e "require('lodash')"
