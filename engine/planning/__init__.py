"""From a discovered model and a policy to a plan and its forecast, before any load: residency per
component, the streaming choice, the request's peak and step time, `--vram-budget`, the plan's
documents (`plan --json`, vLLM-Omni's flags).
"""
