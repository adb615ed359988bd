from __future__ import annotations

import os

from hypothesis import settings

# CI gets more examples than a developer's quick run; both are bounded so the
# suite stays within CI's time.
settings.register_profile("ci", max_examples=500, deadline=None)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
