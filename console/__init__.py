"""omni_console.console"""
