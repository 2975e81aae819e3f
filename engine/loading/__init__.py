"""A plan carried out: components built from local safetensors (straight into place where exact), the
DiT's blocks into the streamer, auxiliaries staged or resident, lean phases and fp8 storage applied,
and a re-plan of a loaded model; `--device` checked and SIGBUS made one line.
"""
