"""The protocol-neutral core: model configs, the repository, request validation, scheduling."""
