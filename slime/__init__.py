"""slime: rollout orchestration for RL of large language models.

Importing slime hooks the process's first import of transformers so that its lazy import table is read
from a cache instead of rescanned (slime.utils.hf_import_cache: ~0.45 CPU s per import, on every engine,
manager and trainer process); `SLIME_HF_IMPORT_CACHE=0` leaves transformers alone."""

import os as _os

__version__ = "0.1.0"

if _os.environ.get("SLIME_HF_IMPORT_CACHE", "1") != "0":
    from slime.utils.hf_import_cache import install as _install

    _install()
