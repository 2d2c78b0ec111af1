"""The hostile tier runs on every real engine, with the engine tier's fixtures."""

from tests.engines.conftest import backend as backend
from tests.engines.conftest import engine as engine
from tests.engines.conftest import executor as executor
from tests.engines.conftest import kube_double_stopped as kube_double_stopped
from tests.engines.conftest import registry as registry
