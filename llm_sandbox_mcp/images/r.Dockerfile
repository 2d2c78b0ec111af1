# Project image for R: the configured base image (the official r-base image, Debian-based, by default) plus
# the packages in r.txt from Debian's r-cran-* packages, and fonts for plots.
ARG BASE=r-base:4.4.2
FROM ${BASE}
USER root
COPY r.txt /tmp/llm-sandbox-mcp/r.txt
RUN set -eux; \
    packages=$(sed 's/#.*//' /tmp/llm-sandbox-mcp/r.txt | tr 'A-Z' 'a-z' | awk 'NF { print "r-cran-" $1 }'); \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        $packages fonts-dejavu-core ca-certificates; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/* /tmp/llm-sandbox-mcp; \
    Rscript -e "library(ggplot2); library(dplyr)"
