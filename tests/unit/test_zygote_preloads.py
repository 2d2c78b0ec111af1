"""Which template a Python call forks from (run/zygote/preloads.py): the preloaded one for code that names numpy,
matplotlib or a library that loads them, the lean one for anything else."""

from __future__ import annotations

import pytest

from llm_sandbox_mcp.run.zygote.preloads import wants_preloaded


@pytest.mark.parametrize(
    "code",
    [
        "import numpy as np\nprint(np.arange(3))",
        "from matplotlib import pyplot as plt\nplt.plot([1, 2])",
        "import pandas as pd",
        "import seaborn",
        "from sklearn.linear_model import LinearRegression",
        "import scipy.stats",
        "x = np.zeros(3)",  # a name the code expects to be there (it is not: still the preloaded template's kind)
    ],
)
def test_code_that_names_numpy_matplotlib_or_what_loads_them_wants_the_preloaded_template(code: str) -> None:
    assert wants_preloaded(code.encode())


@pytest.mark.parametrize(
    "code",
    [
        "print(1)",
        "import json, os\nprint(json.dumps(dict(os.environ)))",
        "numpy_like = [1, 2]\nprint(numpy_like)",  # a longer word is not the library
        "import sympy\nprint(sympy.sqrt(8))",
        "",
        "\xff\xfe not UTF-8",
    ],
)
def test_any_other_code_takes_the_lean_template(code: str) -> None:
    assert not wants_preloaded(code.encode("latin-1"))
