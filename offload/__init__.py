"""omni_console.offload"""
