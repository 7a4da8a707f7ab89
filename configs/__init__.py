"""ml_collections configs, one ``get_config()`` per file (see each module's docstring)."""
