# Local stand-in for the official eclipse-temurin:21-jdk image, built FROM a debootstrapped
# Debian root filesystem (scripts/provision.sh passes BASE) because no registry is reachable.
ARG BASE=llm-sandbox-base:trixie
FROM ${BASE}
ENV LANG=C.UTF-8
# OpenJDK 21 when the suite has it (trixie), else the suite's default JDK (17 on bookworm).
# JAVA_HOME=/opt/java/openjdk as in the official image.
RUN set -eux; \
    apt-get update; \
    jdk=default-jdk-headless; \
    if apt-cache show openjdk-21-jdk-headless >/dev/null 2>&1; then jdk=openjdk-21-jdk-headless; fi; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "$jdk" curl tar; \
    mkdir -p /opt/java; \
    ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v javac)")")")" /opt/java/openjdk; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/opt/java/openjdk \
    PATH=/opt/java/openjdk/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["jshell"]
