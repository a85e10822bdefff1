"""Matplotlib drawings used by the notebooks, made from values the workers really returned.

Each lesson adds its drawing functions here (append at the end). Functions take
an ``ax`` (or create a figure) and return it; they never call ``plt.show()``.
"""

from __future__ import annotations
