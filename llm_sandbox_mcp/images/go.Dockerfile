# Project image for Go: the configured base image (the official golang image by default) as it is; the
# runner needs only the go toolchain and CA certificates, which the official image has. Kept so that every
# language has a project image built the same way.
ARG BASE=golang:1.23-bookworm
FROM ${BASE}
USER root
