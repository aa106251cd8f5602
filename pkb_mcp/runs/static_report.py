"""What a candidate's source still calls, read from its text alone (it is never imported).

The report lists the torch.distributed collectives (and symmetric-memory / functional collectives) the
source refers to, the dense torch compute ops it uses, whether it uses NVLink multicast (refused: our
hosts keep multicast off), and patterns worth a reviewer's eye: harness imports, file and environment
access, threads, processes, ctypes, patched torch/time attributes, frame or heap introspection,
caches keyed by data pointers, and state kept across calls.

Python is read with `ast`: names are resolved through the file's imports (`import torch.distributed as
dist`, `from torch.distributed import all_reduce`), so `dist.all_reduce` and `all_reduce` both count.
CUDA / PTX / C++ sources are string literals: they are searched with regular expressions after their
comments are removed. Module, class and function docstrings are prose and are not searched. A static
report is a hint, not a proof: code built at run time (exec, files read at run time) is invisible to
it, which is itself reported.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from pkb_mcp import python_text
from pkb_mcp.models import StaticReport

# torch.distributed functions that move data between ranks or synchronize them
COLLECTIVES = {
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "scatter",
    "scatter_object_list",
    "gather",
    "gather_object",
    "send",
    "recv",
    "isend",
    "irecv",
    "send_object_list",
    "recv_object_list",
    "batch_isend_irecv",
    "P2POp",
    "barrier",
    "monitored_barrier",
    "new_group",
    "new_subgroups",
    "init_device_mesh",
    # torch.distributed._functional_collectives
    "all_gather_tensor",
    "wait_tensor",
    "permute_tensor",
}
# names that mean a collective whatever they are called on (`pg.allreduce`, `self.dist.all_to_all_single`)
DISTINCTIVE = {
    "all_reduce",
    "allreduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "batch_isend_irecv",
    "allgather",
    "reduce_scatter",
    "alltoall_base",
}
DIST_MODULES = (
    "torch.distributed",
    "torch.distributed.distributed_c10d",
    "torch.distributed._functional_collectives",
)
OP_NAMESPACES = ("torch.ops.c10d", "torch.ops._c10d_functional", "torch.ops.c10d_functional")
SYMM_MEM_OPS = "torch.ops.symm_mem"
SYMM_MEM_MODULE = "torch.distributed._symmetric_memory"
SYMM_MEM_NOT_COMMUNICATING = {
    "empty",
    "is_nvshmem_available",
    "set_backend",
    "get_backend",
    "enable_symm_mem_for_group",
    "is_symm_mem_enabled_for_group",
}

# dense compute that a hand-written kernel would replace (a fallback to the reference keeps these)
COMPUTE_TORCH = {
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "addbmm",
    "baddbmm",
    "einsum",
    "tensordot",
    "inner",
    "outer",
    "dot",
    "mv",
    "addmv",
    "_scaled_mm",
    "_grouped_mm",
    "conv1d",
    "conv2d",
    "conv3d",
    "layer_norm",
    "rms_norm",
    "group_norm",
    "softmax",
    "log_softmax",
    "cumsum",
    "topk",
    "sort",
    "norm",
    "embedding",
}
COMPUTE_FUNCTIONAL = {
    "linear",
    "bilinear",
    "conv1d",
    "conv2d",
    "conv3d",
    "layer_norm",
    "rms_norm",
    "group_norm",
    "softmax",
    "log_softmax",
    "cross_entropy",
    "nll_loss",
    "scaled_dot_product_attention",
    "embedding",
    "gelu",
    "silu",
    "normalize",
}
COMPUTE_LINALG = {"vector_norm", "matrix_norm", "norm", "matmul", "vecdot"}
COMPUTE_METHODS = {"matmul", "mm", "bmm", "addmm", "addmm_", "baddbmm", "softmax", "log_softmax", "einsum"}

# environment variables that turn multicast (NVLS) on: the value that keeps it off
MULTICAST_ENV_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
MULTICAST_CODE = re.compile(
    r"\bmultimem[._]\w*|\bcu(?:da)?Multicast\w*|\bCU_MULTICAST\w*|\bmulticast_ptr\b|\bNVLS\w*\b"
)
C_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)

# calls whose use is reported as suspicious, by resolved name
SUSPICIOUS_CALLS = {
    "open": "reads or writes files",
    "io.open": "reads or writes files",
    "os.open": "reads or writes files",
    "os.listdir": "lists directories",
    "os.scandir": "lists directories",
    "os.walk": "lists directories",
    "glob.glob": "lists directories",
    "os.readlink": "reads /proc or links",
    "pathlib.Path": "reads or writes files",
    "os.getenv": "reads the environment",
    "os.putenv": "writes the environment",
    "os.fork": "forks processes",
    "os.forkpty": "forks processes",
    "os.system": "runs commands",
    "os.popen": "runs commands",
    "os.kill": "signals processes",
    "os._exit": "exits the process",
    "sys.exit": "exits the process",
    "sys._getframe": "inspects the harness's frames",
    "sys._current_frames": "inspects the harness's frames",
    "gc.get_objects": "searches the heap",
    "gc.get_referrers": "searches the heap",
    "gc.get_referents": "searches the heap",
    "exec": "runs code built at run time",
    "eval": "runs code built at run time",
    "compile": "runs code built at run time",
    "__import__": "imports by a run-time name",
    "importlib.import_module": "imports by a run-time name",
    "time.sleep": "sleeps",
}
SUSPICIOUS_PREFIXES = {
    "os.exec": "runs other programs",
    "os.spawn": "runs other programs",
    "os.posix_spawn": "runs other programs",
}
SUSPICIOUS_MODULES = {
    "harness": "imports the harness",
    "pkb_mcp": "imports the host tool",
    "sandbox": "imports the sandbox",
    "threading": "uses threads",
    "_thread": "uses threads",
    "concurrent": "uses threads or processes",
    "multiprocessing": "uses processes",
    "subprocess": "runs other programs",
    "pty": "runs other programs",
    "ctypes": "uses ctypes",
    "cffi": "uses cffi",
    "inspect": "inspects frames",
    "gc": "inspects the heap",
    "socket": "opens sockets",
    "shutil": "copies or removes files",
    "pickle": "unpickles data",
    "signal": "handles signals",
}
SUSPICIOUS_ATTRS = {
    "environ": "reads or writes the environment",
    "f_locals": "inspects the harness's frames",
    "f_globals": "inspects the harness's frames",
    "f_back": "inspects the harness's frames",
    "__globals__": "inspects function globals",
    "modules": None,  # only sys.modules, decided below
}
MUTATING_METHODS = {
    "append",
    "extend",
    "insert",
    "add",
    "update",
    "setdefault",
    "pop",
    "popitem",
    "clear",
    "remove",
    "discard",
    "__setitem__",
}
MUTABLE_FACTORIES = {
    "dict",
    "list",
    "set",
    "defaultdict",
    "OrderedDict",
    "deque",
    "Counter",
    "WeakValueDictionary",
}
MAX_SUSPICIOUS = 40
KEYED_METHODS = ("get", "add", "setdefault", "pop", "__contains__")


@dataclass
class _Found:
    collectives: dict[str, int] = field(default_factory=dict)  # name -> first line
    compute: dict[str, int] = field(default_factory=dict)
    multicast: list[str] = field(default_factory=list)
    suspicious: dict[str, int] = field(default_factory=dict)

    def add(self, bucket: dict[str, int], name: str, line: int) -> None:
        if name not in bucket or line < bucket[name]:
            bucket[name] = line


def _docstring_ids(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            first = body[0].value if body and isinstance(body[0], ast.Expr) else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                ids.add(id(first))
    return ids


class _Analyzer(ast.NodeVisitor):
    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}  # local name -> dotted module/object path
        self.found = _Found()
        self.module_mutables: dict[str, int] = {}
        self.mutated_in_functions: set[str] = set()
        self.globals_declared: set[str] = set()
        self.pointer_names: set[str] = set()  # names bound to a key built from data_ptr() / id()
        self.module_names: set[str] = set()  # names bound to a module fetched at run time
        self.depth = 0  # function nesting

    # ------------------------------------------------------------ names

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted path an expression names, through the file's imports; None when unknown."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            base = self.resolve(node.args[0])
            return f"{base}.{node.args[1].value}" if base else None
        return None

    def suspicious(self, what: str, line: int) -> None:
        self.found.add(self.found.suspicious, what, line)

    # ------------------------------------------------------------ imports

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.asname:
                self.aliases[a.asname] = a.name
            else:
                top = a.name.split(".")[0]
                self.aliases[top] = top
            self._module_used(a.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        for a in node.names:
            self.aliases[a.asname or a.name] = f"{mod}.{a.name}" if mod else a.name
            self._module_used(f"{mod}.{a.name}" if mod else a.name, node.lineno)
            self._name_used(f"{mod}.{a.name}", node.lineno)
        self._module_used(mod, node.lineno)

    def _module_used(self, dotted: str, line: int) -> None:
        top = dotted.split(".")[0]
        if top in SUSPICIOUS_MODULES:
            self.suspicious(f"{SUSPICIOUS_MODULES[top]} ({top})", line)
        if "multimem" in dotted or "multicast" in dotted.lower():
            self.found.multicast.append(f"line {line}: imports {dotted}")

    # ------------------------------------------------------------ uses

    def _name_used(self, dotted: str, line: int) -> None:
        """Classify one resolved name (a call target or a reference)."""
        parts = dotted.split(".")
        last = parts[-1]
        parent = ".".join(parts[:-1])
        if parent in DIST_MODULES and last in COLLECTIVES:
            self.found.add(self.found.collectives, last, line)
        elif parent in OP_NAMESPACES:
            self.found.add(self.found.collectives, f"{parts[-2]}.{last}".lstrip("_"), line)
        elif dotted.startswith(SYMM_MEM_OPS + ".") and len(parts) >= 4:
            self.found.add(self.found.collectives, f"symm_mem.{parts[3]}", line)
        elif (
            parent == SYMM_MEM_MODULE and last not in SYMM_MEM_NOT_COMMUNICATING and not last.startswith("_")
        ):
            self.found.add(self.found.collectives, f"symm_mem.{last}", line)
        if "multimem" in last or ("multicast" in last and not last.startswith(("has_", "is_"))):
            self.found.multicast.append(f"line {line}: {dotted}")
        if parent == "torch" and last in COMPUTE_TORCH:
            self.found.add(self.found.compute, last, line)
        elif parent == "torch.nn.functional" and last in COMPUTE_FUNCTIONAL:
            self.found.add(self.found.compute, f"F.{last}", line)
        elif parent == "torch.linalg" and last in COMPUTE_LINALG:
            self.found.add(self.found.compute, f"linalg.{last}", line)
        if dotted in SUSPICIOUS_CALLS:
            self.suspicious(f"{SUSPICIOUS_CALLS[dotted]} ({dotted})", line)
        for prefix, what in SUSPICIOUS_PREFIXES.items():
            if dotted.startswith(prefix):
                self.suspicious(f"{what} ({dotted})", line)
        if dotted == "sys.modules":
            self.suspicious("reaches into loaded modules (sys.modules)", line)

    def rooted(self, node: ast.AST) -> bool:
        """Whether an expression starts at an imported name (a module or an object from one)."""
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and (node.id in self.aliases or node.id in self.module_names)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self.resolve(node)
        if not isinstance(node.ctx, ast.Load):
            pass  # an assignment to it (a patch) is reported by _assigned
        elif dotted and self.rooted(node):
            self._name_used(dotted, node.lineno)
        elif node.attr in DISTINCTIVE:
            self.found.add(self.found.collectives, node.attr, node.lineno)
        elif node.attr == "multicast_ptr":
            self.found.multicast.append(f"line {node.lineno}: .{node.attr}")
        what = SUSPICIOUS_ATTRS.get(node.attr)
        if what:
            self.suspicious(f"{what} (.{node.attr})", node.lineno)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id in self.aliases:
            self._name_used(self.aliases[node.id], node.lineno)
        elif isinstance(node.ctx, ast.Load) and node.id in SUSPICIOUS_CALLS:
            self.suspicious(f"{SUSPICIOUS_CALLS[node.id]} ({node.id})", node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            dotted = self.resolve(func)
            if func.attr in COMPUTE_METHODS and not (dotted and self.rooted(func)):
                self.found.add(self.found.compute, f".{func.attr}()", node.lineno)
            if func.attr in ("read_text", "read_bytes", "write_text", "write_bytes", "iterdir", "glob"):
                self.suspicious(f"reads or writes files (.{func.attr})", node.lineno)
            if func.attr in MUTATING_METHODS and isinstance(func.value, ast.Name) and self.depth:
                self.mutated_in_functions.add(func.value.id)
        if isinstance(func, ast.Name) and func.id == "getattr":
            dotted = self.resolve(node)
            if dotted and node.args and self.rooted(node.args[0]):
                self._name_used(dotted, node.lineno)
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and node.args:
            target = self.resolve(node.args[0])
            if target and self.rooted(node.args[0]):
                self.suspicious(f"monkeypatches {target} ({func.id})", node.lineno)
        self._env_write(node)
        self._keyed_by_pointer(node)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.found.add(self.found.compute, "@", node.lineno)
        self.generic_visit(node)

    # ------------------------------------------------------------ state, patches, caches

    def _assigned(self, target: ast.AST, line: int, value: ast.AST | None) -> None:
        if isinstance(target, ast.Attribute):
            dotted = self.resolve(target)
            if dotted and self.rooted(target):
                if dotted.startswith("torch.backends."):
                    self.suspicious(f"changes a torch setting ({dotted})", line)
                else:
                    self.suspicious(f"monkeypatches {dotted}", line)
        elif isinstance(target, ast.Subscript):
            base = self.resolve(target.value)
            if base == "os.environ":
                self.suspicious("writes the environment (os.environ)", line)
                self._env_value(target.slice, value, line)
            if isinstance(target.value, ast.Name) and self.depth:
                self.mutated_in_functions.add(target.value.id)
            if self.has_pointer(target.slice):
                self.suspicious("caches by data pointer or object id", line)
        elif isinstance(target, ast.Name):
            if value is not None and self.has_pointer(value):
                self.pointer_names.add(target.id)
            if value is not None and _fetches_module(value):
                self.module_names.add(target.id)
            if self.depth == 0 and value is not None and _is_mutable(value):
                self.module_mutables.setdefault(target.id, line)
            if self.depth and target.id in self.globals_declared:
                self.mutated_in_functions.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._assigned(t, line, None)

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._assigned(t, node.lineno, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._assigned(node.target, node.lineno, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._assigned(node.target, node.lineno, None)
        if isinstance(node.target, ast.Name) and self.depth:
            self.mutated_in_functions.add(node.target.id)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.globals_declared.update(node.names)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function
    visit_Lambda = _function

    def visit_Dict(self, node: ast.Dict) -> None:
        if any(k is not None and self.has_pointer(k) for k in node.keys):
            self.suspicious("caches by data pointer or object id", node.lineno)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and self.has_pointer(node.left):
            self.suspicious("caches by data pointer or object id", node.lineno)
        self.generic_visit(node)

    def _keyed_by_pointer(self, node: ast.Call) -> None:
        func = node.func
        keyed = isinstance(func, ast.Attribute) and func.attr in KEYED_METHODS
        if keyed and node.args and self.has_pointer(node.args[0]):
            self.suspicious("caches by data pointer or object id", node.lineno)

    def has_pointer(self, node: ast.AST) -> bool:
        """Whether an expression holds `.data_ptr()` or `id(...)`, or a name bound to one: a cache key
        that stays the same when the data behind it changes."""
        for n in ast.walk(node):
            if isinstance(n, ast.Call):
                if isinstance(n.func, ast.Attribute) and n.func.attr == "data_ptr":
                    return True
                if isinstance(n.func, ast.Name) and n.func.id == "id":
                    return True
            if isinstance(n, ast.Name) and n.id in self.pointer_names:
                return True
        return False

    # ------------------------------------------------------------ environment (multicast)

    def _env_write(self, node: ast.Call) -> None:
        func = node.func
        dotted = self.resolve(func) if isinstance(func, ast.Attribute) else None
        if dotted in ("os.environ.update", "os.environ.setdefault", "os.putenv"):
            self.suspicious("writes the environment (os.environ)", node.lineno)
            if dotted == "os.environ.update":
                for arg in node.args:
                    if isinstance(arg, ast.Dict):
                        for k, v in zip(arg.keys, arg.values, strict=True):
                            if k is not None:
                                self._env_value(k, v, node.lineno)
                for kw in node.keywords:
                    if kw.arg:
                        self._env_value(ast.Constant(kw.arg), kw.value, node.lineno)
            elif len(node.args) >= 2:
                self._env_value(node.args[0], node.args[1], node.lineno)

    def _env_value(self, key: ast.AST, value: ast.AST | None, line: int) -> None:
        name = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
        if name is None:
            self.suspicious("writes an environment variable named at run time", line)
            return
        off = MULTICAST_ENV_OFF.get(name)
        if off is None:
            if isinstance(value, ast.Constant) and isinstance(value.value, str) and "NVLS" in value.value:
                self.found.multicast.append(f"line {line}: {name}={value.value}")
            return
        if not (isinstance(value, ast.Constant) and str(value.value).strip() == off):
            shown = ast.unparse(value) if value is not None else "?"
            self.found.multicast.append(f"line {line}: sets {name}={shown}")


def _fetches_module(node: ast.AST) -> bool:
    """Whether an expression fetches a module at run time (sys.modules, importlib, __import__)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in ("modules", "import_module"):
            return True
        if isinstance(n, ast.Name) and n.id in ("__import__", "import_module"):
            return True
    return False


def _is_mutable(value: ast.AST) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        f = value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return name in MUTABLE_FACTORIES
    return False


def _strings(tree: ast.AST, skip: set[int]) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found.append((node.lineno, node.value))
    return found


def analyze(source: str | bytes, filename: str = "solution.py") -> StaticReport:
    """The static report of one solution's source; raises SyntaxError (or ValueError) when it does
    not parse."""
    tree = python_text.parse(source, filename=filename)
    a = _Analyzer()
    a.visit(tree)
    for line, text in _strings(tree, _docstring_ids(tree)):
        code = C_COMMENTS.sub(" ", text) if ("\n" in text or ";" in text) else text
        for m in MULTICAST_CODE.finditer(code):
            a.found.multicast.append(f"line {line}: {m.group(0)!r} in a string (CUDA/PTX source?)")
            break
    for name, line in a.module_mutables.items():
        if name in a.mutated_in_functions:
            a.suspicious(f"state kept across calls ({name})", line)
    suspicious = [
        f"line {line}: {what}" for what, line in sorted(a.found.suspicious.items(), key=lambda x: x[1])
    ]
    if len(suspicious) > MAX_SUSPICIOUS:
        suspicious = [*suspicious[:MAX_SUSPICIOUS], f"... and {len(suspicious) - MAX_SUSPICIOUS} more"]
    return StaticReport(
        collectives=sorted(a.found.collectives, key=lambda k: (a.found.collectives[k], k)),
        compute_ops=sorted(a.found.compute, key=lambda k: (a.found.compute[k], k)),
        multicast=bool(a.found.multicast),
        multicast_uses=sorted(set(a.found.multicast), key=_line_of),
        suspicious=suspicious,
    )


def _line_of(entry: str) -> int:
    m = re.match(r"line (\d+)", entry)
    return int(m.group(1)) if m else 0


def refusal(report: StaticReport) -> str | None:
    """The sentence that refuses a candidate before it runs, or None."""
    if not report.multicast:
        return None
    where = "; ".join(report.multicast_uses[:3])
    return (
        f"refused: multicast is unavailable: NVLink multicast (multimem / NVLS) is off on these hosts "
        f"and the solution uses it ({where}); use peer loads and stores, symmetric-memory ops "
        "without multimem, or NCCL"
    )


# what runs only on CUDA GPUs, by a pattern of the source text and its name for a message
GPU_ONLY = (
    (re.compile(r"_symmetric_memory\b|\bsymm_mem\."), "torch symmetric memory"),
    (re.compile(r"\bcuda_sources\b"), "CUDA sources built with load_inline"),
    (re.compile(r"^\s*(?:import|from)\s+triton\b", re.M), "Triton"),
)


def gpu_only(source: str) -> list[str]:
    """The facilities a source uses that exist only on CUDA GPUs ([] when none is seen)."""
    return [name for pattern, name in GPU_ONLY if pattern.search(source)]
