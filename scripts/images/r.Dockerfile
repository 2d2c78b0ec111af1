# Local stand-in for the official r-base:4.4.2 image, built FROM a debootstrapped
# Debian root filesystem (scripts/provision.sh passes BASE) because no registry is reachable.
# The same Debian packages as the official image (R, the recommended packages, the compilers of
# r-base-dev) and no ggplot2; R is the suite's version (4.5 in Debian 13, 4.2 in Debian 12).
ARG BASE=llm-sandbox-base:trixie
FROM ${BASE}
ENV LANG=C.UTF-8
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        r-base r-base-dev r-recommended tar; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*
CMD ["R"]
