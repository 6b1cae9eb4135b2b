"""Placement on a Ray cluster: rollout-engine replicas and verifier (sandbox) workers as Ray actors.

Ray is optional: nothing here is imported on the laptop path (``runtime: local``), and importing
this package does not import ray. See docs/ray.md.
"""
