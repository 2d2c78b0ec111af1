"""Test support code: the Kubernetes API server test double and the local package registries."""
