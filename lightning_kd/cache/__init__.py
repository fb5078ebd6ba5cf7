"""The teacher cache: the teacher's top-k log-probs and tail mass for every scored position of
the training and validation blocks, written once (``lightning-kd cache``) and checked
against the run that reads it (:meth:`TeacherCache.open`). See ``format.py`` for the layout."""

from lightning_kd.cache.format import CacheKey, CacheSpec, cache_key
from lightning_kd.cache.reader import CacheError, CacheMismatch, Records, TeacherCache

__all__ = [
    "CacheError",
    "CacheKey",
    "CacheMismatch",
    "CacheSpec",
    "Records",
    "TeacherCache",
    "cache_key",
]
