# Sphinx configuration of the course book, written by `python -m autograder book`.
# The pages are notebooks already executed (outputs computed by the build), so myst-nb only
# renders them. Everything the pages load is served from the site itself (no CDN): maths is
# MathML written at build time, the theme's fonts and scripts come with the theme.
project = "$project"
copyright = "the course authors"
author = "the course authors"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "$math_extension"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
nb_execution_mode = "off"
nb_output_stderr = "show"
myst_enable_extensions = ["dollarmath", "amsmath", "html_image", "html_admonition"]
myst_dmath_double_inline = True
myst_heading_anchors = 3          # the guides link to each other's sections by their GitHub anchors
html_theme = "sphinx_book_theme"
html_title = "$project"
html_static_path = ["_static"]
html_css_files = ["book.css"]
html_extra_path = ["edition"]
html_copy_source = False
html_show_sourcelink = False
html_math_renderer = "mathml"
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "navigation_with_keys": False,
}
autodoc_member_order = "bysource"
autodoc_mock_imports = ["triton"]
napoleon_google_docstring = True
napoleon_numpy_docstring = True
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type", "myst.xref_missing"]
