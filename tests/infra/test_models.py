"""``ddp_tutorial.models.*``: one module per model family, every name reachable from ``ddp_tutorial.models``,
none over 300 lines, and the registries refuse an unknown name with one line that lists the known ones."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch

import ddp_tutorial.models as models

FAMILIES = sorted(p.stem for p in Path(models.__file__).parent.glob("*.py") if p.stem != "__init__")


def public_names(module_name: str) -> set[str]:
    """Classes, functions and UPPER-case constants a family's module defines at its top level (read with ast)."""
    path = Path(importlib.import_module(f"ddp_tutorial.models.{module_name}").__file__)
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name) and t.id.isupper()}
    return {n for n in names if not n.startswith("_")}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_public_name_of_a_family_is_exported_once(family):
    names = public_names(family)
    assert names, family
    for name in names:
        assert name in models.__all__, f"{family}.{name} missing from ddp_tutorial.models.__all__"
        home = importlib.import_module(f"ddp_tutorial.models.{family}")
        assert getattr(models, name) is getattr(home, name), f"ddp_tutorial.models.{name} is not {family}'s"


def test_all_names_exactly_what_the_families_define():
    defined = set().union(*(public_names(f) for f in FAMILIES))
    assert set(models.__all__) == defined


@pytest.mark.parametrize("family", FAMILIES)
def test_no_family_module_exceeds_300_lines(family):
    path = Path(models.__file__).parent / f"{family}.py"
    assert len(path.read_text().splitlines()) <= 300, path


def test_make_model_refuses_an_unknown_name_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown model 'tiny'; choose one of toy, shared, mlp, big"):
        models.make_model("tiny", seed=0)


def test_make_model_same_seed_same_weights_and_declared_shapes():
    a, (n_in, n_out) = models.make_model("mlp", seed=3)
    b, _ = models.make_model("mlp", seed=3)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert a(torch.zeros(2, n_in)).shape == (2, n_out)
