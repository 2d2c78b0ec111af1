# Project image for Ruby: the configured base image (the official ruby image by default) as it is; its
# default and bundled gems (json, csv, set, bigdecimal, ...) cover the common cases. Kept so that every
# language has a project image built the same way.
ARG BASE=ruby:3.3-slim
FROM ${BASE}
USER root
