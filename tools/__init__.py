"""The repository's own tools (not shipped in the wheel): the docs generators."""
