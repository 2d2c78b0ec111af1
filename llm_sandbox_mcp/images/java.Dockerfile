# Project image for Java: the configured base image (the official eclipse-temurin JDK by default) plus fonts,
# so that AWT/Java2D charts render headless.
ARG BASE=eclipse-temurin:21-jdk
FROM ${BASE}
USER root
RUN set -eux; \
    if command -v apt-get >/dev/null; then \
        apt-get update; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends fontconfig fonts-dejavu-core; \
        apt-get clean; \
        rm -rf /var/lib/apt/lists/*; \
    fi
