"""One request on a loaded pipeline: checked before load, run with per-step timing, guarded against
OOM, profiled against its forecast, watched (block order, residency), and its output written whole.
"""
