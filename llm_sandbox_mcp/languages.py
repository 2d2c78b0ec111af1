"""The languages the server runs: image setting, how code is run, how libraries are named and installed."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from llm_sandbox_mcp.errors import InvalidRequest
from llm_sandbox_mcp.models import LIBS_DIR, OUTPUT_DIR

if TYPE_CHECKING:
    from llm_sandbox_mcp.config import Settings


@cache
def runner_source(name: str) -> str:
    return resources.files("llm_sandbox_mcp.runners").joinpath(name).read_text()


@dataclass(frozen=True)
class Language:
    """How one language is run in a sandbox. Code always arrives on the process's stdin."""

    name: str
    title: str
    file_name: str
    run_argv: Callable[[], list[str]]
    version_argv: tuple[str, ...]
    package_manager: str
    library_syntax: str
    library_pattern: re.Pattern[str]
    install_argv: Callable[[Sequence[str]], list[str]]
    env: dict[str, str] = field(default_factory=lambda: {})
    lib_env: dict[str, str] = field(default_factory=lambda: {})
    plots: str = "no automatic capture; write files to $OUTPUT_DIR to return them"
    examples: tuple[str, ...] = ()
    notes: str = ""
    # Runs through a warm interpreter in the sandbox (runners/python_kernel.py) instead of one exec per call.
    kernel: bool = False
    # For a one-shot run from the pool: the runtime to start ahead of time under runners/supervisor.pl, which
    # then reads the program from stdin (None: one exec per call, as in sessions).
    warm_argv: Callable[[], list[str]] | None = None
    # Installer environment variable -> the Settings field that sets it (a registry, index or mirror).
    registry_env: dict[str, str] = field(default_factory=lambda: {})
    # The install step runs even without libraries, to build a cache every run mounts (Go's build cache).
    warm_cache: bool = False

    def check_libraries(self, libraries: Sequence[str]) -> list[str]:
        """Validated, de-duplicated, sorted specs; raises InvalidRequest naming the first bad one."""
        specs: set[str] = set()
        for library in libraries:
            spec = library.strip()
            if not spec or not self.library_pattern.fullmatch(spec):
                raise InvalidRequest(
                    f"Invalid {self.title} library {library!r}: expected {self.library_syntax}. "
                    "Options, URLs, paths and shell syntax are not accepted."
                )
            specs.add(spec)
        return sorted(specs)


# A run script whose compile step failed ends its stderr with this, so the result can say phase "compile".
COMPILE_FAILED_MARKER = b"\x1ellm-sandbox-phase:compile\x1e\n"

_COMMON_ENV = {"HOME": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "OUTPUT_DIR": str(OUTPUT_DIR)}

# A PEP 508 name, optional extras, optional comma-separated version specifiers; no URLs or markers.
_PIP_SPEC = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?"
    r"(?:\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
    r"(?:(?:===|==|!=|~=|>=|<=|<|>)[A-Za-z0-9.*+!_-]{1,64}"
    r"(?:,(?:===|==|!=|~=|>=|<=|<|>)[A-Za-z0-9.*+!_-]{1,64})*)?"
)


def _pip_install(specs: Sequence[str]) -> list[str]:
    return [
        "python3", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--no-input",
        "--no-warn-script-location", "--target", f"{LIBS_DIR}/python", *specs,
    ]  # fmt: skip


PYTHON = Language(
    name="python",
    title="Python",
    file_name="main.py",
    run_argv=lambda: ["python3", "-c", runner_source("python_kernel.py")],
    kernel=True,
    version_argv=("python3", "--version"),
    package_manager="pip",
    library_syntax="a PyPI requirement such as 'requests', 'numpy==2.1.0' or 'pandas[excel]>=2,<3'",
    library_pattern=_PIP_SPEC,
    install_argv=_pip_install,
    registry_env={"PIP_INDEX_URL": "sandbox_pip_index_url"},
    env={"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "MPLCONFIGDIR": "/tmp/.matplotlib"},
    lib_env={"PYTHONPATH": f"{LIBS_DIR}/python"},
    plots="every matplotlib figure (plt.show(), figures left open, savefig into $OUTPUT_DIR) comes back as PNG",
    examples=(
        "print(sum(range(10)))",
        "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9, 16])\nplt.title('squares')\nplt.show()",
    ),
    notes="Code runs as /workspace/main.py; the working directory is /workspace and is discarded after the call.",
)


def _script(*names: str) -> Callable[[], list[str]]:
    """`sh -c` with the runner scripts `names`, one after the other."""
    return lambda: ["sh", "-c", "".join(runner_source(name) for name in names)]


def _script_install(name: str) -> Callable[[Sequence[str]], list[str]]:
    # Specs travel as positional arguments, never inside the script text.
    return lambda specs: ["sh", "-c", runner_source(name), "sh", *specs]


# An npm package name (optionally @scope/) with an optional version, range or tag; no aliases, URLs or paths.
_NPM_SPEC = re.compile(
    r"(?:@[a-z0-9][a-z0-9._~-]{0,99}/)?[A-Za-z0-9][A-Za-z0-9._~-]{0,213}(?:@[A-Za-z0-9.^~<>=*+_-]{1,64})?"
)


def _npm_install(specs: Sequence[str]) -> list[str]:
    return [
        "npm", "install", "--prefix", f"{LIBS_DIR}/node", "--no-audit", "--no-fund", "--no-update-notifier",
        "--omit=dev", "--loglevel=error", *specs,
    ]  # fmt: skip


JAVASCRIPT = Language(
    name="javascript",
    title="JavaScript",
    file_name="main.js",
    run_argv=lambda: ["node", "-e", runner_source("javascript_runner.js")],
    warm_argv=lambda: ["node", "-e", runner_source("javascript_runner.js")],
    version_argv=("node", "-p", "'Node.js ' + process.version"),
    package_manager="npm",
    library_syntax="an npm package such as 'lodash', 'lodash@4.17.21', '@scope/name@^2' or 'zod@latest'",
    library_pattern=_NPM_SPEC,
    install_argv=_npm_install,
    lib_env={"NODE_PATH": f"{LIBS_DIR}/node/node_modules"},
    registry_env={"NPM_CONFIG_REGISTRY": "sandbox_npm_registry"},
    examples=(
        "const { createHash } = require('node:crypto');\n"
        "console.log(createHash('sha256').update('hello').digest('hex'));",
        "import { setTimeout as sleep } from 'node:timers/promises';\n"
        "await sleep(10);\n"
        "console.log([1, 2, 3].map((n) => n * n));",
    ),
    notes=(
        "Code runs as /workspace/main.js (CommonJS), or as /workspace/main.mjs when it uses ES module syntax "
        "(import/export, top-level await, import.meta). npm libraries are installed into a cache linked as "
        "/workspace/node_modules, so both require() and import find them; their install scripts run in the "
        "install step, which has network, the run has none."
    ),
)

# A module path (a domain, then path elements) with an optional @version, @latest or commit; no options.
_GO_SPEC = re.compile(
    r"[a-z0-9][a-z0-9-]{0,62}(?:\.[a-z0-9][a-z0-9-]{0,62})+"
    r"(?:/[A-Za-z0-9_~+-]{1,100}(?:\.[A-Za-z0-9_~+-]{1,100})*){0,20}"
    r"(?:@[A-Za-z0-9][A-Za-z0-9._+-]{0,99})?"
)

GO = Language(
    name="go",
    title="Go",
    file_name="main.go",
    run_argv=_script("go_run.sh"),
    warm_argv=_script("go_run.sh"),
    version_argv=("go", "version"),
    package_manager="go modules",
    library_syntax="a module path with an optional version, such as 'github.com/google/uuid', "
    "'github.com/google/uuid@v1.6.0' or 'github.com/google/go-cmp@latest'",
    library_pattern=_GO_SPEC,
    install_argv=_script_install("go_install.sh"),
    env={"GOTOOLCHAIN": "local", "GOPATH": "/tmp/go"},
    lib_env={"GOMODCACHE": f"{LIBS_DIR}/go/pkg/mod"},
    registry_env={"GOPROXY": "sandbox_goproxy", "GOSUMDB": "sandbox_gosumdb"},
    warm_cache=True,
    examples=(
        'package main\n\nimport (\n\t"fmt"\n\t"strings"\n)\n\nfunc main() {\n'
        '\tfmt.Println(strings.Repeat("go ", 3))\n}\n',
        'package main\n\nimport (\n\t"fmt"\n\t"sync"\n)\n\nfunc main() {\n\tvar wg sync.WaitGroup\n'
        "\tsquares := make([]int, 5)\n\tfor i := range squares {\n\t\twg.Add(1)\n"
        "\t\tgo func(i int) {\n\t\t\tdefer wg.Done()\n\t\t\tsquares[i] = i * i\n\t\t}(i)\n\t}\n\twg.Wait()\n"
        "\tfmt.Println(squares)\n}\n",
    ),
    notes=(
        "Code is a `package main` program in /workspace/main.go, built with `go build -ldflags='-s -w'` (no "
        "symbol table or DWARF; panics still name functions and lines) and run as ./main; a "
        "build failure is phase 'compile'. Common standard packages come pre-built from a cache made the first "
        "time Go is used (that first call takes about a minute), so a build compiles only your package. "
        "Libraries are module paths with an optional @version, added to a module whose go.mod and go.sum are "
        "copied into /workspace; the run has no module proxy (GOPROXY=off), so import only the listed modules "
        "and the standard library."
    ),
)

# A Debian package name (policy: lowercase letters, digits, + - .); no versions, options or paths.
_DEBIAN_SPEC = re.compile(r"[a-z0-9][a-z0-9+.-]{1,99}")


def _cpp_install(specs: Sequence[str]) -> list[str]:
    """The Debian packages (cpp_install.sh) when there are any, then the precompiled headers (cpp_pch.sh)."""
    names = ("cpp_flags.sh", *(("cpp_install.sh",) if specs else ()), "cpp_pch.sh")
    return ["sh", "-c", "".join(runner_source(name) for name in names), "sh", *specs]


CPP = Language(
    name="cpp",
    title="C++",
    file_name="main.cpp",
    run_argv=_script("cpp_flags.sh", "cpp_run.sh"),
    warm_argv=_script("cpp_flags.sh", "cpp_run.sh"),
    version_argv=("g++", "--version"),
    package_manager="apt (download and unpack only)",
    library_syntax="a Debian package name, normally a -dev package such as 'libfmt-dev' or 'nlohmann-json3-dev'",
    library_pattern=_DEBIAN_SPEC,
    install_argv=_cpp_install,
    warm_cache=True,
    examples=(
        "#include <iostream>\n#include <numeric>\n#include <ranges>\n#include <vector>\n\nint main() {\n"
        "    std::vector<int> v(10);\n    std::iota(v.begin(), v.end(), 1);\n"
        "    for (int n : v | std::views::filter([](int n) { return n % 2 == 0; })) std::cout << n << ' ';\n"
        "    std::cout << '\\n';\n}\n",
    ),
    notes=(
        "Code is compiled as /workspace/main.cpp with `g++ -std=c++20 -O1 -Wall -Wextra` and run as ./main; "
        "warnings appear in stderr, and a compile failure is phase 'compile' with g++'s message. A source whose "
        "first include is <iostream>, <bits/stdc++.h>, <vector> or <string> compiles against that header "
        "precompiled (made the first time C++ is used, 10-20 s). Libraries are "
        "Debian package names: apt cannot install as a non-root user on a read-only root, so each package and "
        "the dependencies the image lacks are downloaded from the image's apt sources and unpacked into the "
        "cache; their headers are on the include path and their libraries are linked (from their pkg-config "
        "files, else every lib*.so they ship). This needs a Debian-based image whose apt sources the installer "
        "can reach; packages that only work once their maintainer scripts ran are not supported."
    ),
)

# group:artifact:version, Maven's own characters only; no ranges, classifiers or repository URLs.
_MAVEN_SPEC = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}:[A-Za-z0-9][A-Za-z0-9_.-]{0,99}:[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}"
)
_JAVA_FLAGS = "-XX:+UseSerialGC -XX:MaxRAMPercentage=75"  # the heap may use most of the sandbox's memory
# The optimising compiler (C2) starts on a method after ten times the calls and loops it does by default: the
# warm-up then costs the pool about a fifth less CPU (C2 compiling javac's code it would hardly use), while
# a program's hot loops still get C2 (unlike -XX:TieredStopAtLevel=1, measured 1.5 times slower on them).
_JAVA_C2_LATER = "-XX:Tier4InvocationThreshold=50000 -XX:Tier4CompileThreshold=60000 -XX:Tier4BackEdgeThreshold=400000"
_JAVA_STORE = f"{LIBS_DIR}/java/.runner"
_HEREDOC_END = "LLM_SANDBOX_RUNNER_END"


def _heredoc(path: str, source: str) -> str:
    """Shell that writes the runner file `source` to `path` (a quoted here-document: nothing is expanded)."""
    return f"cat > \"{path}\" <<'{_HEREDOC_END}'\n{runner_source(source)}{_HEREDOC_END}\n"


def _maven_install(specs: Sequence[str]) -> list[str]:
    """The libraries' jars (java_resolve.java) when there are any, then the runner's fast start (java_prepare.sh)."""
    script = "set -e\n"
    if specs:
        script += _heredoc("/tmp/Resolve.java", "java_resolve.java")
        script += 'java -XX:+UseSerialGC -XX:TieredStopAtLevel=1 /tmp/Resolve.java "$@"\n'
    script += 'set +e\nS=/tmp/.llm-sandbox\nmkdir -p "$S"\n' + _heredoc("$S/Runner.java", "java_runner.java")
    script += runner_source("java_made_for.sh") + runner_source("java_prepare.sh")
    return ["sh", "-c", script, "sh", *specs]


def _java_warm() -> list[str]:
    """The warm JVM (runners/java_runner.java) with the scripts it uses beside it, written at start: from the
    store's runner jar and class data archive when they were made for this very JDK, else from source."""
    script = 'set -e\nS=/tmp/.llm-sandbox\nmkdir -p "$S" /tmp/classes\n'
    for name, source in {"Runner.java": "java_runner.java", "scan.sh": "java_scan.sh", "run.sh": "java_run.sh"}.items():
        script += _heredoc(f"$S/{name}", source)
    script += f"set +e\nR={_JAVA_STORE}\n" + runner_source("java_made_for.sh")
    script += (
        'if made=$(java_made_for "$R") && [ -f "$R/made-for" ] && [ "$(cat "$R/made-for")" = "$made" ]; then\n'
        f'  exec java {_JAVA_FLAGS} {_JAVA_C2_LATER} -XX:SharedArchiveFile="$R/runner.jsa" -Xshare:auto -Xlog:cds=off '
        '-Xlog:cds+dynamic=off -cp "$R/runner.jar" Runner --warm\nfi\n'
        f'exec java {_JAVA_FLAGS} -Xshare:auto "$S/Runner.java"\n'
    )
    return ["sh", "-c", script]


JAVA = Language(
    name="java",
    title="Java",
    file_name="Main.java",
    run_argv=_script("java_scan.sh", "java_run.sh"),
    warm_argv=_java_warm,
    version_argv=("java", "-version"),
    package_manager="Maven (built-in resolver)",
    library_syntax="Maven coordinates group:artifact:version, such as 'com.google.code.gson:gson:2.11.0'",
    library_pattern=_MAVEN_SPEC,
    install_argv=_maven_install,
    registry_env={"LLM_SANDBOX_MAVEN_REPO": "sandbox_maven_repo"},
    warm_cache=True,
    examples=(
        "import java.util.List;\n\npublic class Greeter {\n    record Person(String name, int age) {}\n\n"
        "    public static void main(String[] args) {\n"
        '        var people = List.of(new Person("Ada", 36), new Person("Alan", 41));\n'
        "        people.stream().filter(p -> p.age() > 40).forEach(p -> System.out.println(p.name()));\n"
        "    }\n}\n",
        "class Shape {\n    double area() { return 0; }\n}\n\nclass Square extends Shape {\n"
        "    final double side;\n    Square(double side) { this.side = side; }\n"
        "    double area() { return side * side; }\n}\n\nclass Main {\n"
        "    public static void main(String[] args) {\n        System.out.println(new Square(3).area());\n"
        "    }\n}\n",
    ),
    notes=(
        "Any class name works: the file is named after the public top-level class (javac's rule), else after "
        "the class declaring `static void main`, else Main.java. Several classes may share the snippet (extra "
        "public top-level classes lose `public`, in place), and a package declaration is fine. javac compiles "
        "it (a failure is phase 'compile'), then java runs the class declaring main, in a JVM that started "
        "and warmed javac before the call (from a class data archive made the first time Java is used, a few "
        "seconds). A snippet with no class "
        "and a `void main()` runs as a Java 21 implicitly declared class (preview). Libraries are Maven "
        "coordinates: their jars and compile/runtime dependencies, from SANDBOX_MAVEN_REPO, are on the class "
        "path of javac and java."
    ),
)

# A CRAN package name: letters, digits and dots, starting with a letter, not ending with a dot.
_CRAN_SPEC = re.compile(r"[A-Za-z][A-Za-z0-9.]{0,98}[A-Za-z0-9]")

R = Language(
    name="r",
    title="R",
    file_name="main.R",
    run_argv=_script("r_profile.sh", "r_run.sh"),
    warm_argv=_script("r_profile.sh", "r_runner.sh"),
    version_argv=("Rscript", "--version"),
    package_manager="install.packages (CRAN-like repository)",
    library_syntax="a CRAN package name such as 'data.table' or 'jsonlite' (no versions)",
    library_pattern=_CRAN_SPEC,
    install_argv=lambda specs: ["Rscript", "-e", runner_source("r_install.R"), *specs],
    lib_env={"R_LIBS": f"{LIBS_DIR}/r"},
    registry_env={"LLM_SANDBOX_CRAN_REPO": "sandbox_cran_repo"},
    plots=(
        "every page of every graphics device comes back as PNG: base graphics (plot, hist, ...) and ggplot2 "
        "plots that are printed or left as top-level values, without dev.off(); files written to $OUTPUT_DIR "
        "are returned too"
    ),
    examples=(
        'x <- c(3, 1, 4, 1, 5, 9, 2, 6)\nprint(summary(x))\nhist(x, main = "a histogram")\n',
        'library(ggplot2)\nggplot(mtcars, aes(wt, mpg, colour = factor(cyl))) + geom_point() + ggtitle("mtcars")\n',
    ),
    notes=(
        "Code runs as `Rscript main.R` in /workspace. Plots need no device code: every device writes "
        "figure_NNN.png into $OUTPUT_DIR. Libraries are CRAN package names installed with install.packages() "
        "from SANDBOX_CRAN_REPO, else the image's configured repository; packages the image already has (such "
        "as ggplot2 in the default image) are used as they are. Packages with compiled code need compilers in "
        "the image."
    ),
)

# A gem name with an optional exact :version.
_GEM_SPEC = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}(?::[0-9][0-9A-Za-z.]{0,49})?")

RUBY = Language(
    name="ruby",
    title="Ruby",
    file_name="main.rb",
    run_argv=_script("ruby_run.sh"),
    warm_argv=lambda: ["ruby", "-e", runner_source("ruby_runner.rb")],
    version_argv=("ruby", "--version"),
    package_manager="gem",
    library_syntax="a gem name with an optional exact version, such as 'rainbow' or 'rainbow:3.1.1'",
    library_pattern=_GEM_SPEC,
    install_argv=_script_install("ruby_install.sh"),
    # The trailing ':' keeps the image's own gem directories after the cache.
    lib_env={"GEM_PATH": f"{LIBS_DIR}/ruby:"},
    registry_env={"LLM_SANDBOX_GEM_SOURCE": "sandbox_gem_source"},
    examples=("words = %w[apple banana cherry]\nputs words.map(&:upcase).join(', ')\np words.group_by(&:size)\n",),
    notes=(
        "Code runs as `ruby main.rb` in /workspace. Libraries are gems installed with `gem install` into a "
        "cache on GEM_PATH, from SANDBOX_GEM_SOURCE when set, so require finds them (no Bundler needed). Gems "
        "with native extensions need compilers in the image."
    ),
)

LANGUAGES: dict[str, Language] = {language.name: language for language in (PYTHON, JAVASCRIPT, GO, CPP, JAVA, R, RUBY)}
ALIASES = {
    "py": "python",
    "python3": "python",
    "js": "javascript",
    "node": "javascript",
    "nodejs": "javascript",
    "golang": "go",
    "c++": "cpp",
    "cxx": "cpp",
    "rb": "ruby",
}


def get_language(name: str) -> Language:
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    try:
        return LANGUAGES[key]
    except KeyError:
        raise InvalidRequest(
            f"Unsupported language {name!r}. Supported: {', '.join(LANGUAGES)} (see get_supported_languages)."
        ) from None


def sandbox_env(language: Language, with_libraries: bool) -> dict[str, str]:
    env = {**_COMMON_ENV, **language.env}
    if with_libraries:
        env.update(language.lib_env)
    return env


def install_env(language: Language, settings: Settings) -> dict[str, str]:
    """Variables that point a language's installer at the operator's registry or mirror."""
    env: dict[str, str] = {}
    for variable, setting in language.registry_env.items():
        value: str | None = getattr(settings, setting)
        if value:
            env[variable] = value
    return env
