# Local stand-in for the official python:3.12-slim image, built FROM a debootstrapped
# Debian root filesystem (scripts/provision.sh passes BASE) because no registry is reachable.
# Like the official image it has pip and venv but no third-party libraries (the project image adds
# those). Python 3.12 is in neither Debian 12 (3.11) nor Debian 13 (3.13): this has the suite's Python.
ARG BASE=llm-sandbox-base:trixie
FROM ${BASE}
ENV LANG=C.UTF-8
# python-is-python3 gives the `python` command the official image has. The official image
# has no EXTERNALLY-MANAGED marker, so `pip install` must work here too.
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-pip python3-venv python-is-python3 tar; \
    rm -f /usr/lib/python3*/EXTERNALLY-MANAGED; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*
CMD ["python3"]
