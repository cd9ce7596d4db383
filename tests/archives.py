"""Model folders packed the way an operator uploads them: a zip archive of a folder's files, their names relative
to the folder (with an optional prefix, as when the archive holds the model's own folder)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path


def zip_folder(folder: Path, prefix: str = "") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, prefix + path.relative_to(folder).as_posix())
    return buffer.getvalue()
