"""``--cache-config``, in Triton's spelling: ``<cache>,<setting>=<value>``, repeatable. edged has Triton's ``local``
cache, whose one setting is ``size``, in bytes: ``--cache-config local,size=1048576``."""

from __future__ import annotations

from typing import Any

CACHES = ("local",)


def split_cache_config(value: str) -> tuple[str, str, str]:
    """(cache, setting, value) of one ``--cache-config``; ValueError in Triton's words when it is not of that form."""
    name, comma, setting = value.partition(",")
    if not comma or not name:
        raise ValueError(
            f"No cache specified. --cache-config option format is <cache name>,<setting>=<value>. Got {value}"
        )
    key, equals, item = setting.partition("=")
    if not equals or not key or not item:
        raise ValueError(f"--cache-config option format is '<cache name>,<setting>=<value>'. Got {value}")
    if name not in CACHES:
        raise ValueError(f"unknown cache '{name}' in '{value}': edged has the 'local' cache only")
    if key != "size":
        raise ValueError(f"unknown setting '{key}' of the local cache in '{value}': its one setting is size")
    if not item.isdigit() or int(item) < 1:
        raise ValueError(f"the local cache's size is a number of bytes of at least 1, got '{item}'")
    return name, key, item


def check_cache_config(value: Any) -> None:
    split_cache_config(str(value))


def cache_size(values: list[str]) -> int | None:
    """The local cache's size in bytes (the last one given wins), or None when no cache is configured."""
    size = None
    for value in values:
        _, _, item = split_cache_config(value)
        size = int(item)
    return size
