"""One lock around building a model object, because building one changes process-wide torch state.

diffusers and transformers set `torch.set_default_dtype` (process-wide, not per thread) while they
construct a model and restore it afterwards. Two components built at the same time on two threads
would each see, and restore, the other's default: a module could come out in the wrong dtype. Reads
run outside the lock; only construction holds it.
"""

from __future__ import annotations

import threading

MODEL_CONSTRUCTION = threading.Lock()
