"""Sphinx configuration of the course website (`make site`).

    make site        # build/site/index.html: the lessons with their stored outputs, the API
    make site-test   # the same pages in headless Chromium (tests/browser/test_site.py)

The sources are assembled into build/site-src by ``course_site.py``: the pages of docs/, every
``notebooks/NN_*.ipynb`` (copied, never re-executed: nbval checked their stored outputs) and the
API pages. Nothing is loaded from outside the site: the theme ships its own fonts and icons, and
MathJax comes from the jupyter-server-mathjax wheel.
"""
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS))  # course_site and lessons

project = "ddp-tutorial"
html_title = "ddp-tutorial"
author = "the ddp-tutorial authors"
copyright = "the ddp-tutorial authors, MIT licence"

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.mathjax", "course_site"]

# The stored outputs are the ones nbval compares in CI: show them, never re-execute.
nb_execution_mode = "off"
nb_output_stderr = "show"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
root_doc = "index"

# autodoc imports ddp_tutorial (torch really installed, no mocks)
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_inherit_docstrings = False  # torch's own docstrings belong to torch's docs
add_module_names = False

html_theme = "sphinx_book_theme"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_show_sourcelink = False
html_favicon = "_static/favicon.svg"  # else the browser asks for /favicon.ico
html_context = {"default_mode": "light"}  # the theme logs a console error without one
html_copy_source = False
html_last_updated_fmt = None
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "navbar_persistent": [],  # the sidebar has the search field: no second one in a top bar
}

# MathJax 2 from a local copy (course_site copies the jupyter-server-mathjax wheel's files
# into _static/mathjax); the config names its STIX web fonts, the only ones the wheel ships.
# myst's dollarmath has already turned $..$ into \(..\), so MathJax looks for nothing else.
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
myst_update_mathjax = False
mathjax2_config = {
    "tex2jax": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]],
                "processEscapes": True, "ignoreClass": "highlight|output|cell_output"},
    # MathJax 2 probes web fonts against a "MathJax_Blank" @font-face whose src is
    # url('about:blank'): Chromium refuses that as a font and logs a SEVERE console error on
    # every page with math. local() names a font no one has: the same fallback, no request.
    "HTML-CSS": {"availableFonts": [], "webFont": "STIX-Web", "imageFont": None, "scale": 90,
                 "styles": {"@font-face": {"font-family": "MathJax_Blank",
                                           "src": "local('MathJax_Blank')"}}},
    "menuSettings": {"zoom": "None"},
    "showMathMenu": False,
    "messageStyle": "none",
}
