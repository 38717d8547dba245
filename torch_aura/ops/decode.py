"""Public wrappers of the decode family."""

__all__: list[str] = []
