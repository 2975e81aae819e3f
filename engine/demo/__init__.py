"""The embedded demo model and the safetensors-only pipeline writer it (and the tests' tiny families)
is built with, offline, into a folder written atomically.
"""
