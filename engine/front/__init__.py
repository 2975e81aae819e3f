"""The namespaces of the engine's front door (engine/api.py): each groups related names behind one."""
