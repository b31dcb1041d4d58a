"""Errors raised by the manifest contract. Each names what is wrong and where."""
from gristmill.errors import GristmillError


class ManifestError(GristmillError):
    """Base class: something about a manifest or the files it pins is not valid."""


class SchemaVersionError(ManifestError):
    pass


class MissingFieldError(ManifestError):
    pass


class UnsafePathError(ManifestError):
    """A pinned path is absolute or escapes the dataset version directory."""


class HashMismatchError(ManifestError):
    """A file (or the manifest itself) does not hash to what the manifest pins."""

    def __init__(self, what: str, expected: str, actual: str):
        super().__init__(f"{what}: sha256 mismatch: manifest pins {expected}, file hashes to {actual}")
        self.what, self.expected, self.actual = what, expected, actual


class VersionExistsError(ManifestError):
    pass


class ManifestNotFoundError(ManifestError):
    pass
