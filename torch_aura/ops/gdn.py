"""Public wrappers of the gdn family."""

__all__: list[str] = []
