"""Sample inputs for the decode family ops (see __init__.py)."""

SAMPLES: dict = {}
