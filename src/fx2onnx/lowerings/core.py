"""Lowerings for core ATen ops where torchlib has no implementation or a wrong one."""

from __future__ import annotations
