"""C for one lowered PrimFunc: the entry ``int32_t NAME_unchecked(void**, const int64_t*)``.

The body is the function's statements printed as C: ``For`` loops (the outermost parallel loop
runs on kiln's thread pool, ``kiln_parallel_for`` of ``thread_pool.py`` -- a parallel loop
nested in another runs serially in each task; ``#pragma omp simd`` on scalar loops the
vectorizer marked safe; ``GCC unroll``),
``Allocate`` as a stack array (constant size up to
``kiln.tir.transform.hoist_allocations.STACK_LIMIT`` bytes) or 64-byte
aligned heap memory freed after its body, and stores/loads on the flattened buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...ir.dtype import DataType
from ...ir.errors import CodegenError
from ...ir.node import structural_equal
from ...tir import expr as E
from ...tir import stmt as S
from ...tir.buffer import Buffer
from ...tir.function import ASSUME_ATTR, PrimFunc
from ...tir.functor import Visitor, collect_vars, post_order_visit
from ...tir.transform.hoist_allocations import (
    alloc_size,
    invariant_heap_allocations,
    on_stack,
)
from ...tir.transform.hoist_checks import has_checks
from .expr import ExprEmitter
from .helpers import Helpers
from .names import NameTable
from .types import c_string, soft_float_storage, value_ctype, wrap_int

INDENT = "  "


@dataclass
class FunctionSignature:
    """How a PrimFunc's parameters and symbolic dimensions map to the C entries."""

    params: list[tuple[E.Var, Buffer | None]]
    sym_vars: list[E.Var] = field(default_factory=list)


def variable_uses(stmt: S.Stmt) -> tuple[dict[E.Var, Buffer], dict[E.Var, None], set[E.Var]]:
    """What ``stmt`` uses and defines: the buffers it loads or stores (by data variable), every
    variable it uses (data variables too, first-use order) and the variables it binds itself
    (loops, lets, allocations). A used variable it does not define comes from outside."""
    buffers: dict[E.Var, Buffer] = {}
    used: dict[E.Var, None] = {}
    defined: set[E.Var] = set()

    def visit(n: Any) -> None:
        if isinstance(n, (E.BufferLoad, S.BufferStore)):
            buffers.setdefault(n.buffer.data, n.buffer)
            used.setdefault(n.buffer.data, None)
        elif isinstance(n, E.Var):
            used.setdefault(n, None)
        elif isinstance(n, S.For):
            defined.add(n.loop_var)
        elif isinstance(n, (S.LetStmt, E.Let)):
            defined.add(n.var)
        elif isinstance(n, S.Allocate):
            defined.add(n.buffer.data)

    post_order_visit(stmt, visit)
    return buffers, used, defined


def analyze_signature(func: PrimFunc, name: str) -> FunctionSignature:
    """Parameters in order and the symbolic dims, ordered by first plain occurrence.

    A symbolic variable is bound from the first buffer dimension (or stride) that is exactly
    that variable, scanning parameters in order and dimensions left to right (shapes before
    strides of each buffer). That order is the order of the ``sym`` array.
    """
    params: list[tuple[E.Var, Buffer | None]] = []
    sym: list[E.Var] = []
    scalars = {p for p in func.params if p not in func.buffer_map}
    for p in func.params:
        buf = func.buffer_map.get(p)
        params.append((p, buf))
        if buf is None:
            continue
        for dim in tuple(buf.shape) + tuple(buf.strides):
            if isinstance(dim, E.Var) and dim not in sym:
                if dim in scalars:
                    raise CodegenError(
                        f"{name}: scalar parameter {dim.name!r} is also a buffer dimension; "
                        f"pass it only through the buffer's shape"
                    )
                sym.append(dim)
        if buf.elem_offset is not None and not isinstance(buf.elem_offset, E.IntImm):
            raise CodegenError(
                f"{name}: parameter buffer {buf.name!r} has a symbolic elem_offset, which the C "
                f"backend does not support"
            )

    for _p, buf in params:
        if buf is None:
            continue
        for dim in tuple(buf.shape) + tuple(buf.strides):
            for v in collect_vars(dim):
                if v not in sym:
                    raise CodegenError(
                        f"{name}: symbolic variable {v.name!r} appears in the shape of "
                        f"{buf.name!r} only inside an expression; some parameter must have it "
                        f"as a plain dimension so that it can be bound"
                    )
    return FunctionSignature(params, sym)


def unchecked_signature(symbol: str) -> str:
    """The C declarator of a function's unchecked entry (``symbol`` the checked entry's). It
    returns 0, or ``KILN_CHECK_FAILED`` when a check inside the kernel failed (see
    :meth:`FunctionEmitter.emit`)."""
    return f"int32_t {symbol}_unchecked(void** data, const int64_t* sym)"


#: The C name of the kernel's check record (see the ``check`` helper): a pointer to a record on
#: the stack of the thread that called the kernel, passed to the outlined parallel loop bodies
#: (the calling thread waits for every task of ``kiln_parallel_for``).
CHECK_RECORD = "kiln_chk"


class _ContractedRounding(Visitor):
    """Finds a rounded product (``kiln.tir.rounded``) that an FMA could swallow: an operand of an
    addition or subtraction, or a value bound to a variable (its uses are not seen here)."""

    def __init__(self) -> None:
        self.found = False

    @staticmethod
    def _is_rounded(e: Any) -> bool:
        return isinstance(e, E.Call) and e.op == "rounded"

    def _operands(self, n: Any) -> None:
        if self._is_rounded(n.a) or self._is_rounded(n.b):
            self.found = True
        self.generic_visit(n)

    visit_Add = visit_Sub = _operands

    def _bound(self, n: Any) -> None:
        if self._is_rounded(n.value):
            self.found = True
        self.generic_visit(n)

    visit_Let = visit_LetStmt = _bound


def rounds_products(stmt: S.Stmt) -> bool:
    """Whether ``stmt`` adds a product that must be rounded first (``kiln.tir.rounded``) to
    something: then its kernel is compiled without FMA contraction (:data:`NO_CONTRACTION`).
    Only such kernels pay for it (a rounded product that is only multiplied, divided or stored
    cannot be contracted)."""
    v = _ContractedRounding()
    v.visit(stmt)
    return v.found


#: Around a kernel that rounds products across fused operators (:func:`rounds_products`): GCC
#: compiles its functions with ``-ffp-contract=off`` (its ``__builtin_assoc_barrier`` alone does
#: not survive SLP vectorization); clang keeps ``__arithmetic_fence`` (``KILN_ROUNDED``).
NO_CONTRACTION = ("#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC push_options\n"
                  '#pragma GCC optimize ("fp-contract=off")\n#endif')
NO_CONTRACTION_END = "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC pop_options\n#endif"


def needs_check_record(stmt: S.Stmt) -> bool:
    """Whether code for ``stmt`` records failures: it holds run-time checks or allocates on
    the heap (an allocation can fail)."""
    found = [has_checks(stmt)]

    def visit(n: Any) -> None:
        if isinstance(n, S.Allocate) and not on_stack(n.buffer):
            found[0] = True

    if not found[0]:
        post_order_visit(stmt, visit, exprs=False)
    return found[0]


class FunctionEmitter(ExprEmitter):
    """Generates the unchecked entry of one lowered PrimFunc."""

    def __init__(self, func: PrimFunc, name: str, symbol: str, helpers: Helpers,
                 num_threads: int = 0, analyzer: Any = None):
        super().__init__(helpers, analyzer)
        self.func = func
        self.name = name
        self.symbol = symbol
        self.num_threads = num_threads
        self.names = NameTable()
        self.lines: list[str] = []
        self.depth = 1
        self.parallel_depth = 0
        self.signature = analyze_signature(func, name)
        #: Static functions holding the bodies of parallel loops (see ``_outline``).
        self.outlined: list[str] = []
        #: The variables of the loops around the statement being emitted, outermost first.
        self.loop_vars: list[E.Var] = []

    # ---- helpers --------------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append(INDENT * self.depth + text)

    def define_var(self, v: E.Var) -> str:
        name = self.names.get(v.name)
        self.var_names[v] = name
        return name

    def bind_range(self, v: E.Var, lo: E.PrimExpr, extent: E.PrimExpr) -> None:
        if self.analyzer is None:
            return
        try:
            self.analyzer.bind(v, E.Range(lo, extent))
        except Exception:  # noqa: BLE001 - bounds are only an optimisation here
            pass

    # ---- the function -----------------------------------------------------------------------
    def emit(self) -> str:
        """The unchecked entry. Its body lives in a static function that takes every buffer
        as a ``restrict`` pointer parameter: kernels never get overlapping buffers (the memory
        plan keeps a call's inputs and outputs apart), and GCC only trusts ``restrict`` on
        parameters -- with it, accumulator tiles stay in registers across a reduction loop
        instead of being stored on every iteration.

        The body returns 0, or ``KILN_CHECK_FAILED`` with a message for ``kiln_last_error()``:
        first when an assumption of the function (attr :data:`~kiln.tir.function.ASSUME_ATTR`,
        a condition on its symbolic dims) does not hold, before anything is computed; else
        after the whole body when one of its run-time checks (``check_index``, assertions,
        heap allocations) failed, which the check record collects from every task."""
        sig = self.signature
        ptr_params: list[str] = []
        ptr_args: list[str] = []
        for i, (p, buf) in enumerate(sig.params):
            if buf is None:
                ct = self.scalar_ctype(p.dtype)
                name = self.define_var(p)
                if self.widened(p.dtype):
                    raw = f"*(const {self.storage_ctype(p.dtype)}*)data[{i}]"
                    self.line(f"const {ct} {name} = {self.widen_scalar(p.dtype, raw)};")
                elif p.dtype.is_int and p.dtype.bits < 8:
                    raw = f"*(const {ct}*)data[{i}]"
                    self.line(f"const {ct} {name} = ({ct}){wrap_int(p.dtype, raw)};")
                else:
                    self.line(f"const {ct} {name} = *(const {ct}*)data[{i}];")
                continue
            name = self.define_var(buf.data)
            self.var_names[p] = name
            ct = self.storage_ctype(buf.dtype)
            ptr_params.append(f"{ct}* restrict {name}")
            ptr_args.append(f"({ct}*)data[{i}]")
        for k, v in enumerate(sig.sym_vars):
            name = self.define_var(v)
            ct = value_ctype(v.dtype)
            cast = "" if ct == "int64_t" else f"({ct})"
            self.line(f"const {ct} {name} = {cast}sym[{k}];")
            big = E.IntImm(v.dtype, v.dtype.max_value())
            self.bind_range(v, E.IntImm(v.dtype, 0), big)
        self.line("(void)data;")
        if not sig.sym_vars:
            self.line("(void)sym;")
        for cond, message in self.func.attrs.get(ASSUME_ATTR) or ():
            self._assumption(cond, message)
        checks = needs_check_record(self.func.body)
        if checks:
            self.helpers.use("check")
            self.line(f"kiln_check_t {CHECK_RECORD}_rec = {{0}};")
            self.line(f"kiln_check_t* const {CHECK_RECORD} = &{CHECK_RECORD}_rec;")
        self.stmt(self.func.body)
        if checks:
            self.line(f"if ({CHECK_RECORD}->failed) return kiln_check_report({CHECK_RECORD});")
        self.line("return 0;")
        impl = f"{self.symbol}__body"
        params = ", ".join(["void** data", "const int64_t* sym", *ptr_params])
        args = ", ".join(["data", "sym", *ptr_args])
        header = [*self.outlined,
                  f"/* {self.name}: the kernel; buffers do not overlap */",
                  f"static int32_t {impl}({params}) {{"]
        wrapper = [f"/* {self.name}: unchecked entry (arguments already validated) */",
                   f"{unchecked_signature(self.symbol)} {{",
                   f"  return {impl}({args});", "}"]
        if rounds_products(self.func.body):
            header.insert(0, NO_CONTRACTION)
            wrapper.append(NO_CONTRACTION_END)
        return "\n".join(header + self.lines + ["}", ""] + wrapper) + "\n"

    # ---- statements -------------------------------------------------------------------------
    def stmt(self, s: S.Stmt) -> None:
        method = getattr(self, "stmt_" + type(s).__name__, None)
        if method is None:
            raise CodegenError(
                f"{self.name}: cannot generate C for {type(s).__name__} statements"
                + (" (lower the function first)" if isinstance(s, (S.Block, S.BlockRealize))
                   else "")
            )
        method(s)

    def stmt_SeqStmt(self, s: S.SeqStmt) -> None:
        for x in s.seq:
            self.stmt(x)

    def stmt_Evaluate(self, s: S.Evaluate) -> None:
        if isinstance(s.value, E.IntImm):
            return  # no-op
        self.line(f"(void){self.expr(s.value)};")

    def stmt_For(self, s: S.For) -> None:
        ann = s.annotations
        reason = ann.get("kiln.not_vectorized")
        if reason:
            self.line(f"/* not vectorized: {str(reason).replace('*/', '* /')} */")
        if s.kind == S.ForKind.PARALLEL and self.parallel_depth == 0:
            scratch, body = invariant_heap_allocations(s)
            if self._parallel_for(s.replace(body=body) if scratch else s, scratch):
                return
            self.line("/* parallel loop run serially: its body could not be outlined */")
        elif ann.get("kiln.simd"):
            self.line("#pragma omp simd")
        elif s.kind == S.ForKind.UNROLLED and isinstance(s.extent, E.IntImm):
            if 1 < s.extent.value <= 65534:
                self.line(f"#pragma GCC unroll {s.extent.value}")
        elif s.kind == S.ForKind.SERIAL and 1 < int(ann.get(S.UNROLL_BY, 0)) <= 65534:
            self.line(f"#pragma GCC unroll {int(ann[S.UNROLL_BY])}")
        self.emit_for(s)

    def emit_for(self, s: S.For) -> None:
        """The C ``for`` of ``s``."""
        lo = self.expr(s.min)
        end_expr = s.extent if _is_zero(s.min) else E.add(s.min, s.extent)
        end = self.expr(end_expr)
        var = self.define_var(s.loop_var)
        self.bind_range(s.loop_var, s.min, s.extent)
        ct = value_ctype(s.loop_var.dtype)
        self.line(f"for ({ct} {var} = {lo}; {var} < {end}; ++{var}) {{")
        self.depth += 1
        in_registers = int(bool(s.annotations.get(S.FMA_IN_REGISTERS)))
        self.fma_in_registers += in_registers
        self.loop_vars.append(s.loop_var)
        self.stmt(s.body)
        self.loop_vars.pop()
        self.fma_in_registers -= in_registers
        self.depth -= 1
        self.line("}")

    def _captures(self, s: S.For, scratch: set[E.Var]) -> list[tuple[str, str]] | None:
        """What the body of loop ``s`` uses from outside it, in first-use order: ``(C
        declaration, name)`` per variable (buffers as ``restrict`` pointers); ``scratch``
        buffers are left out (each task allocates its own). None if some variable has no C
        name here."""
        buffers, used, defined = variable_uses(s.body)
        defined.add(s.loop_var)
        out = []
        for v in used:
            if v in defined or v in scratch:
                continue
            name = self.var_names.get(v)
            if name is None:
                return None
            if v in buffers:
                out.append((f"{self.storage_ctype(buffers[v].dtype)}* restrict {name}", name))
            elif v.dtype.is_handle:
                out.append((f"void* {name}", name))
            else:
                out.append((f"{self.ctype_of(v)} {name}", name))
        return out

    def _parallel_for(self, s: S.For, scratch: list[S.Allocate]) -> bool:
        """Run parallel loop ``s`` on kiln's thread pool; False (nothing emitted) when its body
        cannot be outlined.

        The body becomes ``static void F(loop var, captured values...)`` whose buffers are
        ``restrict`` parameters (what the body of a parallel loop needs for GCC to keep
        register tiles in registers), called by a task ``F_task(ctx, begin, end)`` over a range
        of iterations; the loop itself becomes a ``kiln_parallel_for`` call with the captured
        values in a struct. A buffer every iteration allocates alike (``scratch``) is
        allocated once per task instead, its size computed here; a task that cannot allocate
        it records the failure in the kernel's check record and skips its iterations."""
        scratch_vars = {a.buffer.data for a in scratch}
        for a in scratch:  # names (and alignment) first: the body refers to them
            self.define_var(a.buffer.data)
            self.aligned_data.add(a.buffer.data)
        captures = self._captures(s, scratch_vars)
        if captures is None:
            return False
        if scratch or needs_check_record(s.body):  # the body records failures
            captures = [*captures, (f"kiln_check_t* const {CHECK_RECORD}", CHECK_RECORD)]
        k = len(self.outlined)
        fn = f"{self.symbol}__par{k}"
        var = self.define_var(s.loop_var)
        self.bind_range(s.loop_var, s.min, s.extent)
        ct = value_ctype(s.loop_var.dtype)
        # kiln's own names start with kiln_, which no sanitized TIR name does
        sizes = [f"kiln_par{k}_size{i}" for i in range(len(scratch))]
        for size, a in zip(sizes, scratch):
            self.helpers.use("alloc")
            count = strip_parens(self.expr(alloc_size(a.buffer)))
            self.line(f"const int64_t {size} = (int64_t)({count});")
        saved, depth = self.lines, self.depth
        self.lines, self.depth = [], 1
        self.parallel_depth += 1
        in_registers = int(bool(s.annotations.get(S.FMA_IN_REGISTERS)))
        self.fma_in_registers += in_registers
        self.loop_vars.append(s.loop_var)
        try:
            self.stmt(s.body)
            body = self.lines
        finally:
            self.loop_vars.pop()
            self.fma_in_registers -= in_registers
            self.parallel_depth -= 1
            self.lines, self.depth = saved, depth
        scratch_params = [(f"{self.storage_ctype(a.buffer.dtype)}* restrict "
                           f"{self.var_names[a.buffer.data]}", self.var_names[a.buffer.data])
                          for a in scratch]
        params = [f"{ct} {var}"] + [d for d, _ in captures + scratch_params]
        fields = [d.replace("* restrict ", "* ").replace("* const ", "* ") for d, _ in captures]
        fields += [f"int64_t {size}" for size in sizes] + [f"{ct} kiln_lo"]
        call_args = [f"({ct})(kiln_c->kiln_lo + kiln_i)"] + [f"kiln_c->{n}" for _, n in captures]
        call_args += [n for _, n in scratch_params]
        task = [f"static void {fn}_task(void* kiln_ctx, int64_t kiln_begin, int64_t kiln_end) {{",
                f"  const struct {fn}_ctx* kiln_c = (const struct {fn}_ctx*)kiln_ctx;"]
        for size, (decl, name), a in zip(sizes, scratch_params, scratch):
            el = decl.split("* restrict ")[0]
            what = c_string(f"{self.name}: buffer {a.buffer.name}")
            task.append(f"  {el}* {name} = ({el}*)kiln_alloc(kiln_c->{size}, sizeof({el}));")
            task.append(f"  if ({name} == NULL) kiln_check_record(kiln_c->{CHECK_RECORD}, {what}, "
                        f"KILN_CHECK_ALLOC, (long long)kiln_c->{size}, (long long)sizeof({el}), "
                        "0);")
        if scratch:  # no memory for this task's scratch: its iterations are skipped
            missing = " || ".join(f"{n} == NULL" for _, n in scratch_params)
            frees = " ".join(f"free({n});" for _, n in scratch_params)
            task.append(f"  if ({missing}) {{ {frees} return; }}")
        task.append(f"  for (int64_t kiln_i = kiln_begin; kiln_i < kiln_end; ++kiln_i) "
                    f"{fn}({', '.join(call_args)});")
        task += [f"  free({name});" for _, name in reversed(scratch_params)] + ["}", ""]
        self.outlined.append("\n".join([
            f"static void {fn}({', '.join(params)}) {{", *body, "}",
            f"struct {fn}_ctx {{ {' '.join(f + ';' for f in fields)} }};", *task]))
        values = [n for _, n in captures] + sizes + [strip_parens(self.expr(s.min))]
        extent = strip_parens(self.expr(s.extent))
        self.line(f"{{ struct {fn}_ctx kiln_par{k}_ctx = {{{', '.join(values)}}};")
        self.line(f"  kiln_parallel_for({fn}_task, &kiln_par{k}_ctx, (int64_t)({extent}), "
                  f"{self.num_threads}); }}")
        return True

    def stmt_IfThenElse(self, s: S.IfThenElse) -> None:
        cond = s.condition
        if cond.dtype.lanes != 1:
            raise CodegenError(f"{self.name}: if condition must be a scalar, got {cond.dtype}")
        self.line(f"if ({strip_parens(self.expr(cond))}) {{")
        self.depth += 1
        self.stmt(s.then_case)
        self.depth -= 1
        if s.else_case is not None:
            self.line("} else {")
            self.depth += 1
            self.stmt(s.else_case)
            self.depth -= 1
        self.line("}")

    def stmt_LetStmt(self, s: S.LetStmt) -> None:
        value = self.expr(s.value)
        ct = self.ctype_of(s.value)
        if s.var.dtype.lanes > 1 and s.var.dtype.is_bool:
            self.var_mask_bits[s.var] = self.mask_bits(s.value)
        name = self.define_var(s.var)
        const = "const " if s.var.dtype.lanes == 1 else ""
        self.line(f"{const}{ct} {name} = {strip_parens(value)};")
        self.stmt(s.body)

    def stmt_AssertStmt(self, s: S.AssertStmt) -> None:
        """A failed assertion is recorded (the kernel then fails) and skips its body."""
        self.helpers.use("check")
        msg = c_string(f"{self.name}: {s.message}")
        self.line(f"if (!({strip_parens(self.expr(s.condition))})) {{")
        self.line(f"{INDENT}kiln_check_record({CHECK_RECORD}, {msg}, 0, 0, 0, 0);")
        self.line("} else {")
        self.depth += 1
        self.stmt(s.body)
        self.depth -= 1
        self.line("}")

    def _assumption(self, cond: E.PrimExpr, message: str) -> None:
        """Return ``KILN_CHECK_FAILED`` when ``cond`` (on the symbolic dims) does not hold,
        with ``message`` and the values of the dims it uses."""
        used = collect_vars(cond)
        dims = [v for v in self.signature.sym_vars if v in used]
        if len(dims) != len(used):
            raise CodegenError(f"{self.name}: an assumption uses variables that are not "
                               f"symbolic dims of its buffers: {cond}")
        shown = ", ".join(f"{v.name} = %lld" for v in dims)
        fmt = c_string(message, printf=True)[:-1] + (
            f" ({shown})" if shown else "") + '"'
        values = "".join(f", (long long){self.var_names[v]}" for v in dims)
        self.line(f"if (!({strip_parens(self.expr(cond))})) {{")
        self.line(f"{INDENT}kiln_fail({fmt}{values});")
        self.line(f"{INDENT}return KILN_CHECK_FAILED;")
        self.line("}")

    def stmt_Allocate(self, s: S.Allocate) -> None:
        buf = s.buffer
        # Any small constant-size buffer goes on the stack, whatever its scope: compaction puts
        # a stage's scratch (a row's sum, a tile) inside the loop using it, where a heap
        # allocation would run once per iteration (larger ones are hoisted out of serial loops
        # by kiln.tir.transform.hoist_allocations).
        if on_stack(buf):
            ct, name = self.storage_ctype(buf.dtype), self.define_var(buf.data)
            self.aligned_data.add(buf.data)
            self.stack_data.add(buf.data)
            self.line(f"{ct} {name}[{alloc_size(buf).value}] __attribute__((aligned(64)));")
            self.stmt(s.body)
            return
        self._heap_alloc(buf)
        name = self.var_names[buf.data]
        # no memory for it: the failure is recorded and what would use it skipped
        self.line(f"if ({name} == NULL) {self._alloc_failure(buf)} else {{")
        self.depth += 1
        self.stmt(s.body)
        self.line(f"free({name});")
        self.depth -= 1
        self.line("}")

    def _heap_alloc(self, buf: Buffer) -> None:
        """Declare ``buf``'s data pointer and allocate it (64-byte aligned) on the heap; the
        pointer is NULL when the memory is not there (the caller checks)."""
        ct = self.storage_ctype(buf.dtype)
        name = self.define_var(buf.data)
        self.aligned_data.add(buf.data)
        self.helpers.use("alloc")
        size = strip_parens(self.expr(alloc_size(buf)))
        self.line(f"{ct}* {name} = ({ct}*)kiln_alloc((int64_t)({size}), sizeof({ct}));")

    def _alloc_failure(self, buf: Buffer) -> str:
        """The C statement recording that ``buf`` could not be allocated."""
        ct = self.storage_ctype(buf.dtype)
        size = strip_parens(self.expr(alloc_size(buf)))
        what = c_string(f"{self.name}: buffer {buf.name}")
        return (f"{{ kiln_check_record({CHECK_RECORD}, {what}, KILN_CHECK_ALLOC, "
                f"(long long)({size}), (long long)sizeof({ct}), 0); }}")

    def stmt_BufferStore(self, s: S.BufferStore) -> None:
        buf = s.buffer
        if len(s.indices) != 1:
            raise CodegenError(
                f"{self.name}: store to {buf.name} has {len(s.indices)} indices: lower (flatten) "
                f"the function before code generation"
            )
        ptr = self.buffer_ptr(buf)
        idx = s.indices[0]
        el = buf.dtype.element
        value = s.value
        lanes = value.dtype.lanes
        if lanes == 1:
            self.line(self.scalar_store(s, opaque_sum=self._sum_along_loop(s)))
            return
        copy = self._lowp_copy(el, value)
        storage_el = DataType("uint8") if el.is_bool else self.compute_dtype(el)
        if self.widened(el):  # stored as bit patterns, rounded to nearest even
            storage_el = soft_float_storage(el)
            v = copy or f"{self.helpers.lowp_bits(el, lanes)}({self.float32_value(value)})"
        else:
            v = self._tile_fma(s) or self.expr(value)
            if el.is_int and el.bits < 8:
                v = f"({v} & {(1 << el.bits) - 1})"
        vt = self.helpers.vec(storage_el, lanes)
        if el.is_bool:
            v = f"__builtin_convertvector(-{v}, {vt})"
        base = self.contiguous_base(idx)
        if base is not None:
            ref = self.vector_ref(vt, buf, base, lanes, storage_el.itemsize)
            self.line(f"{ref} = {strip_parens(v)};")
            return
        # scatter: one lane at a time
        it = self.ctype_of(idx)
        ti, tv = self.fresh("idx"), self.fresh("val")
        self.line("{")
        self.depth += 1
        self.line(f"{it} {ti} = {self.expr(idx)};")
        self.line(f"{vt} {tv} = {v};")
        self.line(f"for (int kiln_l = 0; kiln_l < {lanes}; ++kiln_l) "
                  f"{ptr}[{ti}[kiln_l]] = {tv}[kiln_l];")
        self.depth -= 1
        self.line("}")

    def scalar_store(self, s: S.BufferStore, opaque_sum: bool = False) -> str:
        """The C statement of a store of one scalar (rounded to a soft float's bits, a bool as
        one byte, a 2/4-bit integer as its zero-extended bit pattern); ``opaque_sum``: the
        value passes through ``Helpers.opaque`` (a step of an in-order float sum, see
        :meth:`_sum_along_loop`)."""
        buf, idx, value = s.buffer, s.indices[0], s.value
        el = buf.dtype.element
        if idx.dtype.lanes != 1:
            raise CodegenError(f"{self.name}: scalar value stored at a vector index")
        copy = self._lowp_copy(el, value)
        if copy is not None:
            v = copy
        elif self.widened(el):
            v = self.narrow_scalar(el, strip_parens(self.float32_value(value)))
        else:
            v = strip_parens(self.expr(value))
            if el.is_bool:
                v = f"(uint8_t)({v})"
            elif el.is_int and el.bits < 8:  # the bit pattern, zero-extended
                v = f"({self.scalar_ctype(el)})({v} & {(1 << el.bits) - 1})"
            elif opaque_sum and el.bits in (32, 64):
                v = f"{self.helpers.opaque(el)}({v})"
        return f"{self.buffer_ptr(buf)}[{strip_parens(self.expr(idx))}] = {v};"

    def _sum_along_loop(self, s: S.BufferStore) -> bool:
        """Whether ``s`` is a step of an in-order float sum along the innermost loop around
        it: it adds to the element it stores to, whose index that loop's variable does not
        change (see ``Helpers.opaque``; an accumulation across the loop's elements, the
        vectorizable kind, is left alone)."""
        if not self.loop_vars or not _is_float_sum(s):
            return False
        return all(self.loop_vars[-1] is not v for v in collect_vars(s.indices[0]))

    def _tile_fma(self, s: S.BufferStore) -> str | None:
        """``acc[i] = acc[i] + a * b`` on a float vector in an array on the stack (a register
        tile's accumulator), inside a loop annotated ``FMA_IN_REGISTERS``, as the helper that
        keeps ``a`` and ``b`` in registers (see :meth:`Helpers.tile_fma`); None for any other
        store."""
        value, el = s.value, s.buffer.dtype.element
        if (not self.fma_in_registers or not isinstance(value, E.Add)
                or s.buffer.data not in self.stack_data
                or not el.is_float or el.bits not in (32, 64) or self.widened(el)
                or el.itemsize * value.dtype.lanes not in (16, 32, 64)):
            return None
        for acc, prod in ((value.a, value.b), (value.b, value.a)):
            if (isinstance(acc, E.BufferLoad) and acc.buffer.data is s.buffer.data
                    and isinstance(prod, E.Mul)
                    and structural_equal(acc.indices[0], s.indices[0], map_free_vars=False)):
                fn = self.helpers.tile_fma(self.compute_dtype(el), value.dtype.lanes)
                args = ", ".join(strip_parens(self.expr(x)) for x in (acc, prod.a, prod.b))
                return f"{fn}({args})"
        return None

    def _lowp_copy(self, el: DataType, value: E.PrimExpr) -> str | None:
        """The bit patterns of a widened float16/bfloat16/float8 value that is a plain (scalar or
        contiguous) load of the same type: copied as is, with no conversion. A scalar
        ``reinterpret`` to that type stores the source bits themselves (a NaN keeps its
        payload and signalling bit, which a trip through float32 would not)."""
        if (self.widened(el) and isinstance(value, E.Call) and value.op == "reinterpret"
                and value.dtype.lanes == 1 and el.bits >= 8):
            return self.expr(E.Call(DataType(f"uint{el.bits}"), "reinterpret", value.args))
        if not (self.widened(el) and isinstance(value, E.BufferLoad)
                and value.buffer.dtype.element == el and len(value.indices) == 1):
            return None
        src = self.buffer_ptr(value.buffer)
        idx = value.indices[0]
        if value.dtype.lanes == 1:
            return f"{src}[{strip_parens(self.expr(idx))}]"
        base = self.contiguous_base(idx)
        if base is None:
            return None
        storage = soft_float_storage(el)
        vt = self.helpers.vec(storage, value.dtype.lanes)
        return f"({self.vector_ref(vt, value.buffer, base, value.dtype.lanes, storage.itemsize)})"


def _is_float_sum(s: S.BufferStore) -> bool:
    """Whether ``s`` adds to (or subtracts from) the float element it stores to."""
    value = s.value
    if not (value.dtype.is_float and isinstance(value, (E.Add, E.Sub))):
        return False
    return any(isinstance(x, E.BufferLoad) and x.buffer.data is s.buffer.data
               and structural_equal(x.indices, s.indices, map_free_vars=False)
               for x in (value.a, value.b))


def _is_zero(e: E.PrimExpr) -> bool:
    return isinstance(e, E.IntImm) and e.value == 0


def strip_parens(text: str) -> str:
    """Drop one pair of enclosing parentheses when they wrap the whole text (never those of a
    GNU statement expression ``({ ...; })``, which are part of its syntax)."""
    if not (text.startswith("(") and text.endswith(")")) or text.startswith("({"):
        return text
    depth = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and i != len(text) - 1:
                return text
    return text[1:-1]
