"""What ferry's Python classes share over the native (_ferry) objects they wrap."""


def forwarded(name, doc=None):
    """A read-only property whose value is ``self._native.<name>``, read each time."""
    return property(lambda self: getattr(self._native, name), doc=doc)
