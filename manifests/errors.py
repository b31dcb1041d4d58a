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


class FactMismatchError(ManifestError):
    """A pinned file does not hold what the manifest states about it (row count, row width, token
    dtype, size, schema...): a manifest whose hash is valid but whose facts are wrong."""

    def __init__(self, what: str, field: str, stated, actual, hint: str = ""):
        super().__init__(f"{what}: {field}: manifest states {stated}, file holds {actual}"
                         + (f"; {hint}" if hint else ""))
        self.what, self.field, self.stated, self.actual = what, field, stated, actual


class PinnedFileError(ManifestError):
    """A file the manifest pins is missing or cannot be read."""


class TokenOutOfVocabError(FactMismatchError):
    """A shard holds a token id >= the tokenizer's vocab_size the manifest states."""


class ManifestDecodeError(ManifestError):
    """manifest.json is not UTF-8 JSON: a damaged file or a damaged read."""


class LatestPointerError(ManifestError):
    """A store's ``latest`` file does not hold a version number."""


class EditedManifestError(HashMismatchError):
    """manifest.json does not hash to the sha256 it records: edited after publishing (or damaged in transit)."""


class VersionExistsError(ManifestError):
    pass


class ManifestNotFoundError(ManifestError):
    pass


class PublishError(ManifestError):
    """A publish failed part way (a full disk, a store that refused a write); nothing was published."""
