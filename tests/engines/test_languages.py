"""One table-driven suite over every language, on every real backend: what a programmer of that language
expects from `execute_code`.

Libraries come from the real registries these machines reach (PyPI, npm, Debian's archive) or, for the
ecosystems they cannot reach (Go modules, CRAN, RubyGems, Maven Central), from local registries the session
builds and serves on a loopback address under the host's own name (tests/support/registries). Installers
reach both through the egress proxy, as on a user's machine (tests/support/egress.py says why the public
registries are listed in SANDBOX_INSTALL_ALLOW_HOSTS here).
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llm_sandbox_mcp.errors import InstallFailed
from llm_sandbox_mcp.languages import LANGUAGES, get_language
from llm_sandbox_mcp.models import Execution
from llm_sandbox_mcp.run.executor import Executor
from tests.engines.conftest import RecordingBackend, engine_settings
from tests.support.egress import loopback_name
from tests.support.registries import Package, cran_repo, gem_source, go_proxy, maven_repo, serve

pytestmark = pytest.mark.anyio

PNG = b"\x89PNG\r\n\x1a\n"
TEXT = "héllo wörld ✓ 日本語 🎉"


@dataclass(frozen=True)
class Case:
    """Programs in one language. Each is the smallest program that shows the behaviour."""

    language: str
    hello: str  # prints "hello, world"
    fails: str  # prints "partial" to stdout, "problem" to stderr, exits with 3
    unicode: str  # prints TEXT, which is a literal in its source
    busy: str  # prints "started", then loops forever
    broken: str  # does not compile (or, interpreted, does not parse)
    broken_message: str  # part of the compiler's (or parser's) message
    compiled: bool = False


CASES = [
    Case(
        "python",
        hello="print('hello, world')\n",
        fails="import sys\nprint('partial')\nprint('problem', file=sys.stderr)\nsys.exit(3)\n",
        unicode=f"print('{TEXT}')\n",
        busy="print('started', flush=True)\nwhile True:\n    pass\n",
        broken="def f(:\n    pass\n",
        broken_message="SyntaxError",
    ),
    Case(
        "javascript",
        hello="console.log('hello, world');\n",
        fails="console.log('partial');\nconsole.error('problem');\nprocess.exit(3);\n",
        unicode=f"console.log('{TEXT}');\n",
        busy="console.log('started');\nwhile (true) {}\n",
        broken="function f( {\n",
        broken_message="SyntaxError",
    ),
    Case(
        "go",
        hello='package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hello, world")\n}\n',
        fails=(
            'package main\n\nimport (\n\t"fmt"\n\t"os"\n)\n\nfunc main() {\n\tfmt.Println("partial")\n'
            '\tfmt.Fprintln(os.Stderr, "problem")\n\tos.Exit(3)\n}\n'
        ),
        unicode=f'package main\n\nimport "fmt"\n\nfunc main() {{\n\tfmt.Println("{TEXT}")\n}}\n',
        busy='package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("started")\n\tfor {\n\t}\n}\n',
        broken='package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println(undeclared)\n}\n',
        broken_message="undefined: undeclared",
        compiled=True,
    ),
    Case(
        "cpp",
        hello='#include <iostream>\n\nint main() {\n    std::cout << "hello, world\\n";\n}\n',
        fails=(
            '#include <iostream>\n\nint main() {\n    std::cout << "partial" << std::endl;\n'
            '    std::cerr << "problem" << std::endl;\n    return 3;\n}\n'
        ),
        unicode=f'#include <iostream>\n\nint main() {{\n    std::cout << "{TEXT}" << std::endl;\n}}\n',
        busy=(
            '#include <iostream>\n\nint main() {\n    std::cout << "started" << std::endl;\n'
            "    volatile unsigned long n = 0;\n    for (;;) n = n + 1;\n}\n"
        ),
        broken="int main() {\n    return undeclared_name;\n}\n",
        broken_message="'undeclared_name' was not declared",
        compiled=True,
    ),
    Case(
        "java",
        # Not "Main": any class name works.
        hello=(
            "public class Hello {\n    public static void main(String[] args) {\n"
            '        System.out.println("hello, world");\n    }\n}\n'
        ),
        fails=(
            "class Main {\n    public static void main(String[] args) {\n"
            '        System.out.println("partial");\n        System.err.println("problem");\n'
            "        System.exit(3);\n    }\n}\n"
        ),
        unicode=(
            "public class Texts {\n    public static void main(String[] args) {\n"
            f'        System.out.println("{TEXT}");\n    }}\n}}\n'
        ),
        busy=(
            "public class Busy {\n    public static void main(String[] args) {\n"
            '        System.out.println("started");\n        long n = 0;\n        while (true) { n++; }\n    }\n}\n'
        ),
        broken=(
            'public class Broken {\n    public static void main(String[] args) {\n        int x = "text";\n    }\n}\n'
        ),
        broken_message="incompatible types",
        compiled=True,
    ),
    Case(
        "r",
        hello='cat("hello, world\\n")\n',
        fails='cat("partial\\n")\nmessage("problem")\nquit(status = 3)\n',
        unicode=f'cat("{TEXT}\\n")\n',
        busy='cat("started\\n")\nflush(stdout())\nrepeat {}\n',
        broken="f <- function( {\n",
        broken_message="unexpected",
    ),
    Case(
        "ruby",
        hello="puts 'hello, world'\n",
        fails="puts 'partial'\nwarn 'problem'\nexit 3\n",
        unicode=f"puts '{TEXT}'\n",
        busy="puts 'started'\n$stdout.flush\nloop {}\n",
        broken="def f(\n",
        broken_message="syntax error",
    ),
]
IDS = [case.language for case in CASES]
# Where what a language does by itself (its output, exit codes, Unicode, compile errors, modules, plots, the
# documented examples, each runtime's own quirks below) is proven: once per place its runtime comes from. Docker's
# images (which the Kubernetes double runs its pods on as well), Podman's own builds of them, and the host's
# runtimes (bubblewrap's, which NsJail runs too). What each engine adds (it runs the runtime at all, kills at the
# timeout, installs through its proxy, brings files back) runs on all, here and in test_contract.
RUNTIME_SOURCES = [
    pytest.param(name, marks=getattr(pytest.mark, name), id=name) for name in ("docker", "podman", "bubblewrap")
]


def test_the_table_covers_every_language() -> None:
    assert [case.language for case in CASES] == list(LANGUAGES)


@dataclass(frozen=True)
class Registries:
    """Settings that point the installers at the local registries, and the package each one holds."""

    settings: dict[str, str]
    packages: dict[str, Package]


@pytest.fixture(scope="session")
def registries() -> Iterator[Registries]:
    token = str(secrets.randbelow(10**9))
    with tempfile.TemporaryDirectory(prefix="llm-sandbox-registries-") as tmp:
        root = Path(tmp)
        builders: dict[str, tuple[str, Callable[[Path, str], Package]]] = {
            "go": ("go", go_proxy),
            "r": ("cran", cran_repo),
            "ruby": ("gems", gem_source),
            "java": ("maven", maven_repo),
        }
        packages: dict[str, Package] = {}
        for language, (directory, build) in builders.items():
            (root / directory).mkdir()
            packages[language] = build(root / directory, token)
        # Under the host's own name: Go, Ruby and Java go direct, not through the egress proxy, to 127.0.0.1.
        name, address = loopback_name()
        with serve(root, address, name) as url:
            yield Registries(
                settings={
                    "sandbox_goproxy": f"{url}/go",
                    "sandbox_gosumdb": "off",
                    "sandbox_cran_repo": f"{url}/cran/",
                    "sandbox_gem_source": f"{url}/gems",
                    "sandbox_maven_repo": f"{url}/maven",
                },
                packages=packages,
            )


# Libraries from the registries these machines reach.
REMOTE_PACKAGES = {
    "python": Package(
        "tabulate==0.9.0", "from tabulate import tabulate\nprint(tabulate([[1, 2]]))\n", "-  -\n1  2\n-  -\n"
    ),
    # ES module syntax (resolved through /workspace/node_modules) and require() in the same program.
    "javascript": Package(
        "ms@2.1.3",
        "import ms from 'ms';\nimport { createRequire } from 'node:module';\n"
        "const required = createRequire(import.meta.url)('ms');\nconsole.log(ms(60000), required(120000));\n",
        "1m 2m\n",
    ),
    "cpp": Package(
        "libfmt-dev",
        '#include <fmt/core.h>\n\nint main() {\n    fmt::print("{} + {} = {}\\n", 1, 2, 1 + 2);\n}\n',
        "1 + 2 = 3\n",
    ),
}


@pytest.fixture
async def lang_executor(backend: RecordingBackend, engine: str, registries: Registries) -> AsyncIterator[Executor]:
    async with Executor(engine_settings(engine, **registries.settings), backend) as executor:
        yield executor
    # The per-session packages' caches are of no use to a later session (once no sandbox mounts them).
    for language, package in registries.packages.items():
        await backend.drop_cache(executor.libraries.key(get_language(language), [package.spec]))


async def run(executor: Executor, case: Case, code: str, **kwargs: object) -> Execution:
    return await executor.execute(code, case.language, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_hello_world(lang_executor: Executor, case: Case) -> None:
    result = await run(lang_executor, case, case.hello, timeout=120)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hello, world\n", ""), result.stderr
    assert result.language == case.language and result.phase == "run" and not result.timed_out


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("engine", RUNTIME_SOURCES)
async def test_stdout_stderr_and_a_non_zero_exit_come_back(lang_executor: Executor, case: Case) -> None:
    result = await run(lang_executor, case, case.fails, timeout=60)
    assert result.exit_code == 3, result.stderr
    assert result.stdout == "partial\n"
    assert result.stderr.strip() == "problem"
    assert result.phase == "run"


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("engine", RUNTIME_SOURCES)
async def test_unicode_in_and_out(lang_executor: Executor, case: Case) -> None:
    result = await run(lang_executor, case, case.unicode, timeout=60)
    assert result.stdout == f"{TEXT}\n", result.stderr


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("engine", RUNTIME_SOURCES)
async def test_code_that_does_not_compile_fails_in_the_right_phase(lang_executor: Executor, case: Case) -> None:
    result = await run(lang_executor, case, case.broken, timeout=60)
    assert result.exit_code != 0
    assert case.broken_message in result.stderr.replace("‘", "'").replace("’", "'")
    assert result.phase == ("compile" if case.compiled else "run")
    assert "llm-sandbox-phase" not in result.stderr


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_a_busy_loop_is_killed_at_the_timeout_and_its_output_kept(lang_executor: Executor, case: Case) -> None:
    result = await run(lang_executor, case, case.busy, timeout=3)
    assert result.timed_out
    assert result.exit_code != 0
    assert result.stdout == "started\n"
    assert "timed out after 3 s" in result.stderr


# The local registries' packages carry this session's token, so they install on every engine; the public ones
# are installed afresh on Docker only (one real install per language is the proof; the other engines' own way to
# the registries is proven by the contract suite's fresh install, and here they may reuse an earlier run's store).
FRESH_PUBLIC_INSTALLS = "docker"


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_a_library_installs_and_the_code_uses_it(
    lang_executor: Executor, backend: RecordingBackend, engine: str, registries: Registries, case: Case
) -> None:
    package = registries.packages.get(case.language) or REMOTE_PACKAGES[case.language]
    fresh = case.language in registries.packages or engine == FRESH_PUBLIC_INSTALLS
    if engine == FRESH_PUBLIC_INSTALLS:
        backend.fresh_stores()
    result = await run(lang_executor, case, package.code, libraries=[package.spec], timeout=120)
    assert (result.exit_code, result.stdout) == (0, package.expected), result.stderr
    if fresh:
        installer = get_language(case.language).install_argv([package.spec])
        assert installer in backend.argvs, f"{package.spec} came from a store an earlier run left"


MISSING = {
    "python": ("no-such-package-llm-sandbox-zz9", "No matching distribution|not find a version"),
    "javascript": ("no-such-package-llm-sandbox-zz9", "404"),
    "go": ("example.com/no-such-module@v1.0.0", "404|not found"),
    "cpp": ("no-such-package-llm-sandbox-zz9", "Unable to locate package"),
    "java": ("org.example:no-such-artifact:1.0.0", "not found"),
    "r": ("nosuchpackage.llmsandbox", "not installed: nosuchpackage.llmsandbox"),
    "ruby": ("no-such-gem-llm-sandbox-zz9", "Could not find a valid gem"),
}


# How each engine reaches each registry is proven by the install above, on every engine: what is left here is the
# installer's own message, which comes from the runtime.
@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("engine", RUNTIME_SOURCES)
async def test_a_library_that_does_not_exist_is_an_install_error_with_the_installers_message(
    lang_executor: Executor, case: Case
) -> None:
    spec, message = MISSING[case.language]
    with pytest.raises(InstallFailed, match=message):
        await run(lang_executor, case, case.hello, libraries=[spec], timeout=60)


PLOTS = {
    "python": (
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nplt.bar(['a', 'b'], [3, 4])\n",
        ["figure_001.png", "figure_002.png"],
    ),
    "r": (
        "plot(1:10)\nhist(rnorm(100))\nlibrary(ggplot2)\n"
        "ggplot(data.frame(x = 1:3, y = c(2, 4, 3)), aes(x, y)) + geom_line()\n",
        ["figure_001.png", "figure_002.png", "figure_003.png"],
    ),
}


@pytest.mark.parametrize("language", list(PLOTS))
@pytest.mark.parametrize("engine", RUNTIME_SOURCES)
async def test_every_plot_comes_back_as_a_png_with_no_setup_text(lang_executor: Executor, language: str) -> None:
    code, names = PLOTS[language]
    result = await lang_executor.execute(code, language, timeout=60)
    assert (result.exit_code, result.stdout) == (0, ""), result.stderr
    assert [artifact.name for artifact in result.artifacts] == names
    for artifact in result.artifacts:
        assert artifact.mime_type == "image/png" and artifact.data is not None and artifact.data.startswith(PNG)


EXAMPLES = [
    pytest.param(lang.name, index, id=f"{lang.name}-{index}")
    for lang in LANGUAGES.values()
    for index in range(len(lang.examples))
]


@pytest.mark.parametrize(("language", "index"), EXAMPLES)
@pytest.mark.parametrize("engine", RUNTIME_SOURCES)
async def test_every_example_in_the_language_details_runs(lang_executor: Executor, language: str, index: int) -> None:
    result = await lang_executor.execute(get_language(language).examples[index], language, timeout=120)
    assert result.exit_code == 0, result.stderr
    assert result.stdout or result.artifacts


# What programmers of one language expect beyond the table.


@pytest.mark.parametrize("engine", RUNTIME_SOURCES)
async def test_java_runs_whatever_the_class_names_packages_and_number_of_public_classes(
    lang_executor: Executor,
) -> None:
    code = (
        "package com.example.app;\n\nimport java.util.List;\n\n"
        "class Helper {\n    static String shout(String s) { return s.toUpperCase(); }\n}\n\n"
        "public class Shapes {\n    public static void main(String[] args) {\n"
        '        System.out.println(Helper.shout(new Circle(2).name()) + " " + List.of(1, 2).size());\n'
        "    }\n}\n\npublic class Circle {\n    final int r;\n    Circle(int r) { this.r = r; }\n"
        '    String name() { return "circle" + r; }\n}\n'
    )
    result = await lang_executor.execute(code, "java", timeout=60)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "CIRCLE2 2\n", "")


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("console.log(require.main === module, __filename);\n", "true /workspace/main.js\n"),
        ("export const x = 1;\nconsole.log(import.meta.url);\n", "file:///workspace/main.mjs\n"),
        ("const n = await Promise.resolve(7);\nconsole.log(n);\n", "7\n"),
        ("async function f() {\n  await null;\n}\nf().then(() => console.log(typeof require));\n", "function\n"),
    ],
    ids=["commonjs", "module", "top-level-await", "await-inside-a-function-is-commonjs"],
)
@pytest.mark.parametrize("engine", RUNTIME_SOURCES)
async def test_javascript_runs_commonjs_and_es_modules(lang_executor: Executor, code: str, expected: str) -> None:
    result = await lang_executor.execute(code, "javascript", timeout=60)
    assert (result.exit_code, result.stdout) == (0, expected), result.stderr


@pytest.mark.parametrize("engine", RUNTIME_SOURCES)
async def test_go_builds_against_the_prebuilt_standard_library_cache(lang_executor: Executor, engine: str) -> None:
    """Without libraries: a project image's own (go.Dockerfile), the store left empty; the host's toolchain
    (bubblewrap) has none, so the store's."""
    code = 'package main\n\nimport (\n\t"fmt"\n\t"os"\n)\n\nfunc main() {\n\tfmt.Println(os.Getenv("GOCACHE"))\n}\n'
    result = await lang_executor.execute(code, "go", timeout=120)
    expected = "/opt/llm-sandbox/libs/go/cache" if engine == "bubblewrap" else "/opt/llm-sandbox/go-cache"
    assert (result.exit_code, result.stdout) == (0, f"{expected}\n"), result.stderr


@pytest.mark.parametrize("engine", RUNTIME_SOURCES)
async def test_cpp_warnings_are_visible_when_the_program_compiles(lang_executor: Executor) -> None:
    code = '#include <cstdio>\n\nint main() {\n    int unused = 1;\n    std::puts("ok");\n}\n'
    result = await lang_executor.execute(code, "cpp", timeout=60)
    assert (result.exit_code, result.stdout, result.phase) == (0, "ok\n", "run")
    assert "-Wunused-variable" in result.stderr
