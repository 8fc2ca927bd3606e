"""Start-up as agentd alone is installed: httpx imports its optional command-line client (click, rich, pygments)
whenever click can be imported. The test environment has click (uvicorn's); a plain ``pip install agentd-trio``
does not. Putting this directory on ``PYTHONPATH`` makes click unimportable, so a measurement or an import check
sees agentd's own imports, not those of the environment it happens to run in."""

import sys

sys.modules.setdefault("click", None)  # type: ignore[assignment]
