"""Several GPUs serving one model: the rank layout and its checks and forecast, the rank processes and
their leader, `GroupEngine` (an `EngineHandle` over them) and CFG-parallel.
"""
