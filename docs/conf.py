"""Sphinx configuration of mccloud's documentation (``./run docs``)."""

# The package is imported as installed (``./run docs`` builds and installs
# the wheel first): its native module is part of it.

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))

project = "mccloud"
author = "mccloud contributors"
copyright = "mccloud contributors"  # noqa: A001 (Sphinx's name)

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.graphviz",
    "mccloud_cli",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
graphviz_output_format = "svg"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}
# The execution modules, runners and states are Salt loader modules: they
# read __opts__, __pillar__, __salt__ when called, never when imported.
exclude_patterns = ["_build", "_ext"]
html_theme = "alabaster"
html_title = "mccloud"
nitpicky = False
