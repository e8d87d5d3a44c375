"""The old name of :mod:`statecodec.boundary`, kept for one release.

The boundary (judging a request, sealing a result, the wire error) is no adapter: it is
the one place every adapter and the proxy call. Import :mod:`statecodec.boundary`; this
module re-exports its public names unchanged and will be removed after the next release.
"""

from __future__ import annotations

from ..boundary import *  # noqa: F403  (the whole public surface, unchanged)
from ..boundary import __all__  # noqa: F401  (re-exported)
