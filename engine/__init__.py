"""omni_console.engine"""
