"""Sample inputs for the aura family ops (see __init__.py)."""

SAMPLES: dict = {}
