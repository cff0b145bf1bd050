"""What the public functions accept as a file name, once for the package."""

from __future__ import annotations

import os
from typing import Union

PathLike = Union[str, "os.PathLike[str]"]
