# Local stand-in for the official python:3.12-slim image, built FROM a debootstrapped
# Debian root filesystem (scripts/provision.sh passes BASE) because no registry is reachable.
ARG BASE=llm-sandbox-base:trixie
FROM ${BASE}
ENV LANG=C.UTF-8
# python-is-python3 gives the `python` command the official image has. The official image
# has no EXTERNALLY-MANAGED marker, so `pip install --target DIR pkg` must work here too.
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-pip python3-venv python3-numpy python3-matplotlib python-is-python3 tar; \
    rm -f /usr/lib/python3*/EXTERNALLY-MANAGED; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*
CMD ["python3"]
