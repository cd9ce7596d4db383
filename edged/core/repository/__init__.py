"""Model repositories and what is loaded from them: scanning folders (scan.py), the manager of loaded versions
(manager.py), model control: loads, swaps, polling, the load API (control.py), fingerprints and checksums
(files.py), private copies of models loaded with overrides (private_copies.py) and the check of a repository
without serving it (check.py)."""
