# Runs inside the sandbox as `python3 -c <this file>`: the user's code arrives on stdin.
# It is written to /workspace/main.py and executed as __main__, so tracebacks name main.py with the
# user's own line numbers. Matplotlib figures (plt.show() or left open) are saved to the output directory.
# Prints nothing of its own. Must run on any Python 3.8+.
import os
import sys
import traceback

_OUT = os.environ.get("OUTPUT_DIR", "/workspace/outputs")
_SHIM = "/tmp/.llm_sandbox"
_BACKEND = """
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas  # noqa: F401
from matplotlib.backend_bases import FigureManagerBase as FigureManager  # noqa: F401


def show(*args, **kwargs):
    save_open_figures()


def save_open_figures():
    import os
    import matplotlib.pyplot as plt

    out = os.environ.get("OUTPUT_DIR", "/workspace/outputs")
    for num in plt.get_fignums():
        index = 1
        while True:
            path = os.path.join(out, "figure_%03d.png" % index)
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                break
            except FileExistsError:
                index += 1
        plt.figure(num).savefig(path, format="png", dpi=100)
    plt.close("all")
"""


def _prepare():
    os.makedirs(_OUT, exist_ok=True)
    os.makedirs(_SHIM, exist_ok=True)
    with open(os.path.join(_SHIM, "llm_sandbox_mpl.py"), "w") as shim:
        shim.write(_BACKEND)
    sys.path.insert(0, _SHIM)
    # Child processes of the user's code inherit the capture too.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_SHIM, os.environ.get("PYTHONPATH")) if p)
    os.environ["MPLBACKEND"] = "module://llm_sandbox_mpl"


def _main():
    source = sys.stdin.buffer.read()
    _prepare()
    path = os.path.join(os.getcwd(), "main.py")
    with open(path, "wb") as handle:
        handle.write(source)
    sys.stdin = open(os.devnull)
    sys.argv = [path]
    sys.path.insert(0, os.getcwd())
    namespace = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    status = 0
    try:
        code = compile(source, path, "exec", dont_inherit=True)
        exec(code, namespace)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except SyntaxError as exc:
        traceback.print_exception(type(exc), exc, None)
        status = 1
    except BaseException as exc:
        # Drop this runner's own frame so the traceback starts in the user's code.
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        status = 1
    finally:
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None and pyplot.get_fignums():
            try:
                import llm_sandbox_mpl

                llm_sandbox_mpl.save_open_figures()
            except Exception:
                traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(status)


_main()
