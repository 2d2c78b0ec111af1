"""The run core: from a validated request to an outcome (pool, zygote, kernels, sessions, jobs, files, libraries).

Nothing here is imported before the server answers `tools/list`."""
