"""Salt grain modules (found through the ``salt.loader`` entry point)."""
