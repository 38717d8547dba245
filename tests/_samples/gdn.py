"""Sample inputs for the gdn family ops (see __init__.py)."""

SAMPLES: dict = {}
