"""The contract every part of gristmill shares: manifests, token shards, the document index.

The pipeline writes it; the loader, trainer and audit read it. Nothing here imports the
pipeline, loader or trainer.
"""
from .builder import DatasetBuilder
from .doc_index import DOC_INDEX_SCHEMA, check_doc_index, read_doc_index, write_doc_index
from .errors import (
    EditedManifestError,
    FactMismatchError,
    HashMismatchError,
    LatestPointerError,
    ManifestDecodeError,
    ManifestError,
    ManifestNotFoundError,
    MissingFieldError,
    PinnedFileError,
    PublishError,
    SchemaVersionError,
    TokenOutOfVocabError,
    UnsafePathError,
    VersionExistsError,
)
from .hashing import canonical_json, sha256_bytes, sha256_file, sha256_json
from .manifest import SCHEMA_VERSION, EvalSet, FileRef, Input, Manifest, Shard, Tokenizer, token_dtype_for
from .provenance import code_version
from .shards import MappedShard, check_vocab, checked_rows, read_rows, write_cache_form, write_shard
from .store import ManifestStore, Published, join, load_manifest
from .verify import Problem, verify_published

__all__ = [
    "DOC_INDEX_SCHEMA", "SCHEMA_VERSION", "DatasetBuilder", "EditedManifestError", "EvalSet", "FactMismatchError", "FileRef",
    "HashMismatchError", "Input", "LatestPointerError", "MappedShard", "Manifest", "ManifestDecodeError",
    "ManifestError", "ManifestNotFoundError", "ManifestStore", "MissingFieldError", "PinnedFileError", "Problem",
    "Published", "PublishError", "SchemaVersionError", "Shard", "TokenOutOfVocabError", "Tokenizer", "UnsafePathError",
    "VersionExistsError", "canonical_json", "check_doc_index", "check_vocab", "checked_rows", "code_version", "join",
    "load_manifest", "read_doc_index", "read_rows", "sha256_bytes",
    "sha256_file", "sha256_json", "token_dtype_for", "verify_published", "write_cache_form", "write_doc_index",
    "write_shard",
]
