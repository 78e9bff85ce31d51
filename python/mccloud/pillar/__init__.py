"""Salt ext_pillar modules (found through the ``salt.loader`` entry point)."""
