# Project image for Python: the configured base image (the official python image by default) plus the
# libraries agents import first, pinned in python.txt. Built by `llm-sandbox-mcp images build`.
ARG BASE=python:3.12-slim
FROM ${BASE}
USER root
ARG PIP_INDEX_URL
COPY python.txt install-ca.pem /tmp/llm-sandbox-mcp/
# install-ca.pem: SANDBOX_INSTALL_CA_BUNDLE (TLS-inspecting proxies), trusted by this step only.
# PIP_BREAK_SYSTEM_PACKAGES and --ignore-installed let a Debian-based custom base take them too (its
# EXTERNALLY-MANAGED marker, and Debian-installed copies pip cannot uninstall, which these then shadow).
RUN set -eux; \
    if [ -s /tmp/llm-sandbox-mcp/install-ca.pem ]; then \
        export SSL_CERT_FILE=/tmp/llm-sandbox-mcp/install-ca.pem PIP_CERT=/tmp/llm-sandbox-mcp/install-ca.pem \
            REQUESTS_CA_BUNDLE=/tmp/llm-sandbox-mcp/install-ca.pem NODE_EXTRA_CA_CERTS=/tmp/llm-sandbox-mcp/install-ca.pem; \
    fi; \
    if [ -z "${PIP_INDEX_URL:-}" ]; then unset PIP_INDEX_URL; fi; \
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --disable-pip-version-check --no-input \
        --root-user-action=ignore --ignore-installed -r /tmp/llm-sandbox-mcp/python.txt; \
    rm -rf /tmp/llm-sandbox-mcp; \
    python3 -c "import matplotlib, numpy, pandas"
