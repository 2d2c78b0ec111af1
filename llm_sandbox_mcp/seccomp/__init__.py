"""The one syscall policy of every sandbox (`policy`) and its renderings: the OCI profile for the container
engines (`oci`), the classic-BPF filter for bubblewrap and zygote children (`bpf`). NsJail's Kafel rendering
lives with NsJail (`backends/_nsjail/policy.py`).

This module imports nothing: each rendering is built when its module is imported.
"""
