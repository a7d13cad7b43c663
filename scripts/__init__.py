"""Maintainer scripts. ``scripts.factory`` is the wheel factory; ``pick_wheel.py`` is for users."""
