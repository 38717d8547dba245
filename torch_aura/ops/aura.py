"""Public wrappers of the aura family."""

__all__: list[str] = []
