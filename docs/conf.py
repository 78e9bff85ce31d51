"""Sphinx configuration of mccloud's documentation (``./run docs``)."""

# The package is imported as installed (``./run docs`` builds and installs
# the wheel first): its native module is part of it.

project = "mccloud"
author = "mccloud contributors"
copyright = "mccloud contributors"  # noqa: A001 (Sphinx's name)

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.graphviz",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
graphviz_output_format = "svg"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}
# The execution modules, runners and states are Salt loader modules: they
# read __opts__, __pillar__, __salt__ when called, never when imported.
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = "mccloud"
nitpicky = False
