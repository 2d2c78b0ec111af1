"""Test support code: the Kubernetes API server test double, the local package registries and the stand-in models."""
