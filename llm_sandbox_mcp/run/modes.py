"""How a run treats its sandbox: a one-shot call's, used for this run alone, or a session's cell, whose
interpreter keeps its state from one run to the next."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from llm_sandbox_mcp.artifacts import Artifact
from llm_sandbox_mcp.languages import Language
from llm_sandbox_mcp.models import WORKDIR


@dataclass(frozen=True)
class OneShot:
    """A call's one run: the runner forks it a process that ends with it, every output file comes back, and a
    compiled program may take its binary from the build cache (only when `cached`)."""

    cached: bool = True
    keeps_state: ClassVar[bool] = False
    runner_mode: ClassVar[Literal["fork", "inline"]] = "fork"

    def label(self) -> str:
        return ""

    def filename(self, language: Language) -> str:
        return str(WORKDIR / language.file_name)

    def files(self, outputs: list[Artifact]) -> list[Artifact]:
        return outputs


@dataclass
class Cell:
    """A session's next cell: what a session carries from one run to the next."""

    number: int = 0
    # For languages without a kernel: what the output directory held after the last run.
    seen: dict[str, tuple[int, bytes | None]] = field(default_factory=lambda: {})
    keeps_state: ClassVar[bool] = True
    runner_mode: ClassVar[Literal["fork", "inline"]] = "inline"

    def label(self) -> str:
        return f" (cell {self.number})"

    def filename(self, language: Language) -> str:
        return f"<cell {self.number}>"

    def files(self, outputs: list[Artifact]) -> list[Artifact]:
        """The files that changed since the last cell."""
        current = {a.name: (a.size, a.data) for a in outputs}
        fresh = [a for a in outputs if self.seen.get(a.name) != current[a.name]]
        self.seen = current
        return fresh


RunMode = OneShot | Cell
