"""Which of a sandbox kind's two templates forks a call: with numpy and matplotlib preloaded, or without.

Every fork copies the template's page tables and every exit frees them, and a call's sandbox is made by three
(the call's child, its PID 1, the program's process): with matplotlib loaded the template holds about 40 MiB
of private memory instead of 4, which made a `print(1)` cost about 18 ms of CPU in the sandboxes' processes
instead of 9 (benchmarks/stages.py), and so bounded calls per second. Code that names a library that loads
numpy or matplotlib goes to the preloaded template, whose plot costs no import; anything else to the lean one.
The choice only decides speed: either template runs any code (the lean one imports what the code imports, at
the code's own cost), so a word in a comment or a library missed by the list costs time, never a result.
"""

from __future__ import annotations

import re

# Libraries of the Python image that import numpy or matplotlib (their import names), and the two themselves.
_PRELOADED = re.compile(
    rb"\b(?:numpy|matplotlib|pylab|mpl_toolkits|pandas|scipy|seaborn|sklearn|statsmodels|pyarrow|plt|np|pd)\b"
)


def wants_preloaded(code: bytes) -> bool:
    """Whether this Python code is likely to import numpy or matplotlib, so that a template which has them
    loaded already runs it sooner than one that must import them."""
    return _PRELOADED.search(code) is not None
