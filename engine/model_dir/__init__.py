"""The model directory, read as untrusted input before anything loads: its files, headers, configs and
classes, and what each component is (`discover_model` -> `ModelInfo`). No weights are read, no torch.
"""
