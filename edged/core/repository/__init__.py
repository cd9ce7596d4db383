"""Model repositories and what is loaded from them: scanning folders (scan.py), the manager of loaded versions
(manager.py), model control: loads, swaps, polling, the load API (control.py), fingerprints and checksums
(files.py) and private copies of models loaded with overrides (private_copies.py)."""
