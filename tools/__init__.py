"""Project tooling that is no part of the package: the docs' generated reference pages."""
