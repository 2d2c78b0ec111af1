"""Defaults read by more than the package: the image of each language and the unprivileged sandbox user.

Kept as plain literals in this one file, because provisioning (scripts/provision.sh) reads it with nothing
but bash, before anything is installed, to build stand-ins of exactly these images.
"""

IMAGES = {
    "python": "python:3.12-slim",
    "javascript": "node:22-slim",
    "go": "golang:1.23-bookworm",
    "cpp": "gcc:14",
    "java": "eclipse-temurin:21-jdk",
    "r": "r-base:4.4.2",
    "ruby": "ruby:3.3-slim",
}
# nobody:nogroup on Debian and most images: owns nothing, can do nothing it is not given.
SANDBOX_USER = "65534:65534"
