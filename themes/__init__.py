"""omni_console.themes"""
