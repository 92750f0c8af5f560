"""Pass infrastructure: declared passes, the PassContext that decides what runs, Sequential.

Every graph or TIR transformation is a :class:`Pass` that *declares* itself (name, opt level,
the passes it requires) with one of the decorators :func:`module_pass`, :func:`function_pass`
or :func:`prim_func_pass`. Declaring puts the pass in a registry, so that

- ``Sequential`` can run a pass's required passes (looked up by name) before it,
- ``PassContext(required_pass=..., disabled_pass=...)`` can check the names it is given
  (a typo in ``disabled_pass`` is an error, not a silent no-op),
- ``kiln.transform.list_passes()`` lists every pass with its summary.

The :class:`PassContext` (a thread-local stack of context managers) holds the opt level, the
required/disabled pass names, a validated config and the instruments that observe each pass run
(timing, IR dumps, the well-formed checker). A pass called directly always runs (only
``Sequential`` gates by opt level), and always returns a *new* IRModule: passes never modify the
module they are given; the runner checks that.
"""

from __future__ import annotations

import difflib
import inspect
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..graph.expr import Function
from ..ir.errors import InternalError, KilnError, error_context
from ..ir.module import IRModule
from ..tir.function import PrimFunc

__all__ = [
    "FunctionPass", "ModulePass", "Pass", "PassContext", "PassInfo", "PrimFuncPass",
    "Sequential", "function_pass", "get_pass", "list_configs", "list_passes", "module_pass",
    "prim_func_pass", "register_config",
]


@dataclass(frozen=True)
class PassInfo:
    """What a pass declares about itself: its name, the lowest opt level that runs it (inside a
    Sequential), and the names of the passes that must run right before it."""

    name: str
    opt_level: int
    required: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------
# registry of declared passes
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Declared:
    info: PassInfo
    summary: str
    origin: str  # "module.qualname" of the declaration
    make: Callable[[], Pass]  # a fresh (or the) instance, for required-pass lookup


_REGISTRY: dict[str, _Declared] = {}
_REGISTRY_LOCK = threading.Lock()


def _summary(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.strip().splitlines()[0].strip() if doc.strip() else ""


def _register(decl: _Declared) -> None:
    """Record a declaration. A name taken by a pass of the kiln package cannot be reused by a
    different declaration (that would silently change what ``required`` resolves to); other
    re-declarations (tests, notebooks re-running a cell) replace the previous one."""
    with _REGISTRY_LOCK:
        old = _REGISTRY.get(decl.info.name)
        if old is not None and old.origin != decl.origin and old.origin.startswith("kiln."):
            raise KilnError(
                f"pass name {decl.info.name!r} is already declared by {old.origin}; "
                f"{decl.origin} must use another name"
            )
        _REGISTRY[decl.info.name] = decl


def get_pass(name: str) -> Pass:
    """A pass instance for a declared pass name (how required passes are resolved)."""
    decl = _REGISTRY.get(name)
    if decl is None:
        raise KilnError(f"no pass named {name!r} is declared{_did_you_mean(name, _REGISTRY)}")
    return decl.make()


def list_passes() -> list[tuple[str, int, str]]:
    """``(name, opt_level, summary)`` of every declared pass, sorted by name."""
    return sorted((d.info.name, d.info.opt_level, d.summary) for d in _REGISTRY.values())


def _did_you_mean(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=3)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""


# ---------------------------------------------------------------------------------------------
# config registry
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfigOption:
    """A registered PassContext config key: its value type, default and documentation."""

    key: str
    type: type | tuple[type, ...]
    default: Any
    doc: str


_CONFIGS: dict[str, ConfigOption] = {}


def _type_name(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return t.__name__


def _check_config_value(opt: ConfigOption, value: Any) -> Any:
    """The value converted to the option's type (ints are accepted for floats), or KilnError."""
    types = opt.type if isinstance(opt.type, tuple) else (opt.type,)
    if isinstance(value, bool) and bool not in types:
        ok = False  # True is an int to Python, but never a meaningful count/size
    elif isinstance(value, types):
        ok = True
    elif float in types and isinstance(value, int):
        value, ok = float(value), True
    else:
        ok = False
    if not ok:
        raise KilnError(
            f"PassContext config {opt.key!r} expects {_type_name(opt.type)}, got "
            f"{type(value).__name__} {value!r}"
        )
    return value


def register_config(key: str, type: type | tuple[type, ...], default: Any = None,  # noqa: A002
                    doc: str = "") -> ConfigOption:
    """Declare a PassContext config key (conventionally ``"<PassName>.<option>"``).

    Registering the same key again with the same type and default is allowed (module reloads);
    a conflicting re-registration raises KilnError.
    """
    if not isinstance(key, str) or not key:
        raise KilnError(f"register_config: key must be a non-empty string, got {key!r}")
    opt = ConfigOption(key, type, default, doc)
    if default is not None:
        _check_config_value(opt, default)
    old = _CONFIGS.get(key)
    if old is not None and (old.type != type or old.default != default):
        raise KilnError(
            f"register_config: {key!r} is already registered with type "
            f"{_type_name(old.type)} and default {old.default!r}"
        )
    _CONFIGS[key] = opt
    return opt


def list_configs() -> list[ConfigOption]:
    """Every registered config option, sorted by key."""
    return [_CONFIGS[k] for k in sorted(_CONFIGS)]


# ---------------------------------------------------------------------------------------------
# PassContext
# ---------------------------------------------------------------------------------------------
_TLS = threading.local()


def _stack() -> list[PassContext]:
    stack = getattr(_TLS, "stack", None)
    if stack is None:
        stack = _TLS.stack = [PassContext()]
    return stack


def _check_names(kind: str, names: Iterable[str]) -> tuple[str, ...]:
    if isinstance(names, str):
        names = (names,)
    out = tuple(names)
    for n in out:
        if not isinstance(n, str):
            raise KilnError(f"PassContext {kind}: pass names must be strings, got {n!r}")
        if n not in _REGISTRY:
            raise KilnError(
                f"PassContext {kind}: no pass named {n!r} is declared"
                f"{_did_you_mean(n, _REGISTRY)}"
            )
    return out


class PassContext:
    """What runs and how: opt level, required/disabled passes, config and instruments.

    Use as a context manager; :meth:`current` is the innermost active context of this thread
    (a default one at opt level 2 when none is active). ``instruments=None`` (the default)
    inherits the enclosing context's instruments, so a nested context that only changes the
    opt level keeps e.g. the timing or well-formed instrument of the outer one; pass ``()`` for
    none. Only a context that *owns* instruments calls their ``enter_pass_ctx``/``exit_pass_ctx``.
    """

    def __init__(self, opt_level: int = 2, required_pass: Iterable[str] = (),
                 disabled_pass: Iterable[str] = (), config: Mapping[str, Any] | None = None,
                 instruments: Iterable[Any] | None = None):
        if not isinstance(opt_level, int) or isinstance(opt_level, bool) or opt_level < 0:
            raise KilnError(f"PassContext opt_level must be an int >= 0, got {opt_level!r}")
        self.opt_level = opt_level
        self.required_pass = _check_names("required_pass", required_pass)
        self.disabled_pass = _check_names("disabled_pass", disabled_pass)
        checked: dict[str, Any] = {}
        for key, value in dict(config or {}).items():
            opt = _CONFIGS.get(key)
            if opt is None:
                raise KilnError(
                    f"PassContext config: unknown key {key!r}{_did_you_mean(key, _CONFIGS)}; "
                    "keys must be declared with kiln.transform.register_config"
                )
            checked[key] = _check_config_value(opt, value)
        self.config: Mapping[str, Any] = MappingProxyType(checked)
        self._own_instruments = None if instruments is None else tuple(instruments)
        self._inherited: tuple[Any, ...] = ()
        self._entered = False

    # -- configuration -----------------------------------------------------------------------
    @property
    def instruments(self) -> tuple[Any, ...]:
        """The instruments that observe pass runs in this context (own or inherited)."""
        return self._own_instruments if self._own_instruments is not None else self._inherited

    def get_config(self, key: str, default: Any = None) -> Any:
        """The configured value of a registered key, else ``default`` if given, else the
        registered default."""
        opt = _CONFIGS.get(key)
        if opt is None:
            raise KilnError(f"PassContext config: unknown key {key!r}"
                            f"{_did_you_mean(key, _CONFIGS)}")
        if key in self.config:
            return self.config[key]
        return opt.default if default is None else default

    def pass_enabled(self, info: PassInfo) -> bool:
        """Whether a Sequential runs a pass: required names always, then disabled names never,
        else when its opt level is at most the context's."""
        if info.name in self.required_pass:
            return True
        if info.name in self.disabled_pass:
            return False
        return info.opt_level <= self.opt_level

    # -- context manager ---------------------------------------------------------------------
    @staticmethod
    def current() -> PassContext:
        """The innermost active PassContext of this thread."""
        return _stack()[-1]

    def __enter__(self) -> PassContext:
        if self._entered:
            raise KilnError("PassContext is already active; make a new one to nest")
        stack = _stack()
        self._inherited = stack[-1].instruments
        entered: list[Any] = []
        try:
            for inst in self._own_instruments or ():
                inst.enter_pass_ctx()
                entered.append(inst)
        except BaseException:
            for inst in reversed(entered):
                inst.exit_pass_ctx()
            raise
        stack.append(self)
        self._entered = True
        return self

    def __exit__(self, *exc: Any) -> None:
        stack = _stack()
        if not stack or stack[-1] is not self:
            raise InternalError("PassContext exited out of order")
        stack.pop()
        self._entered = False
        for inst in reversed(self._own_instruments or ()):
            inst.exit_pass_ctx()

    # -- running -----------------------------------------------------------------------------
    def run_pass(self, p: Pass, mod: IRModule) -> IRModule:
        """Run one pass on ``mod`` with this context's instruments (no opt-level gating)."""
        if not isinstance(mod, IRModule):
            raise KilnError(f"pass {p.info.name} expects an IRModule, got {type(mod).__name__}")
        info = p.info
        instruments = self.instruments
        if not p._instrumented:
            with error_context(f"pass {info.name}", prefix=False):
                return p._transform(mod, self)
        for inst in instruments:
            if not inst.should_run(mod, info):
                return mod.copy()
        for inst in instruments:
            inst.run_before_pass(mod, info)
        snapshot = (dict(mod.items()), dict(mod.attrs))
        # a KilnError keeps its message (spans name the model nodes); anything else becomes an
        # InternalError naming the pass
        with error_context(f"pass {info.name}", prefix=False):
            new = p._transform(mod, self)
        if not isinstance(new, IRModule):
            raise InternalError(
                f"pass {info.name} returned {type(new).__name__}, expected an IRModule"
            )
        _check_unchanged(info.name, mod, snapshot)
        if new is mod:
            new = mod.copy()
        for inst in instruments:
            inst.run_after_pass(new, info)
        return new

    def __repr__(self) -> str:
        return (f"PassContext(opt_level={self.opt_level}, required_pass={self.required_pass}, "
                f"disabled_pass={self.disabled_pass}, config={dict(self.config)}, "
                f"instruments={list(self.instruments)})")


def _check_unchanged(name: str, mod: IRModule, snapshot: tuple[dict, dict]) -> None:
    """Passes build new modules; catch one that edited its input in place."""
    funcs, attrs = snapshot
    now = dict(mod.items())
    if now.keys() != funcs.keys() or any(now[k] is not funcs[k] for k in funcs):
        changed = sorted(set(now) ^ set(funcs) | {k for k in funcs if now.get(k) is not funcs[k]})
        raise InternalError(f"pass {name} modified its input module (functions {changed}); "
                            "passes must return a new IRModule")
    now_attrs = mod.attrs
    if now_attrs.keys() != attrs.keys() or any(now_attrs[k] is not attrs[k] for k in attrs):
        raise InternalError(f"pass {name} modified the attrs of its input module")


# ---------------------------------------------------------------------------------------------
# passes
# ---------------------------------------------------------------------------------------------
class Pass:
    """A module-to-module transformation with a declared :class:`PassInfo`.

    ``pass_(mod)`` runs it under :meth:`PassContext.current` (always, whatever the opt level),
    firing the context's instruments, and returns a new IRModule.
    """

    info: PassInfo = PassInfo("Pass", 0)
    _instrumented = True

    @property
    def name(self) -> str:
        return self.info.name

    def __call__(self, mod: IRModule, ctx: PassContext | None = None) -> IRModule:
        return (ctx or PassContext.current()).run_pass(self, mod)

    def _transform(self, mod: IRModule, ctx: PassContext) -> IRModule:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{self.info.name}(opt_level={self.info.opt_level})"


class ModulePass(Pass):
    """A pass over the whole module: ``transform_module(mod, ctx) -> IRModule``."""

    def _transform(self, mod: IRModule, ctx: PassContext) -> IRModule:
        return self.transform_module(mod, ctx)  # type: ignore[attr-defined]


class _PerFunctionPass(Pass):
    """Shared driver of function and PrimFunc passes: transform each function of one kind."""

    _kind: type = object
    _kind_name = ""

    def _transform(self, mod: IRModule, ctx: PassContext) -> IRModule:
        new = mod.copy()
        for name, func in mod.items():
            if not isinstance(func, self._kind_type()):
                continue
            out = self.transform_function(func, mod, ctx)  # type: ignore[attr-defined]
            if not isinstance(out, self._kind_type()):
                raise InternalError(
                    f"pass {self.info.name} returned {type(out).__name__} for {self._kind_name} "
                    f"{name!r}, expected a {self._kind_name}"
                )
            if out is not func:
                new[name] = out
        return new

    def _kind_type(self) -> type:
        raise NotImplementedError


class FunctionPass(_PerFunctionPass):
    """Runs ``transform_function(func, mod, ctx)`` on every graph Function of the module."""

    _kind_name = "graph Function"

    def _kind_type(self) -> type:
        return Function


class PrimFuncPass(_PerFunctionPass):
    """Runs ``transform_function(func, mod, ctx)`` on every tir PrimFunc of the module."""

    _kind_name = "PrimFunc"

    def _kind_type(self) -> type:
        return PrimFunc


class Sequential(Pass):
    """Run passes in order, each gated by the context (opt level, required/disabled names),
    with each pass's required passes run right before it.

    Sequential itself does not fire instruments (only the passes it runs do), so timings and
    dumps show the real passes; nested Sequentials are gated by their own opt level.
    """

    _instrumented = False

    def __init__(self, passes: Sequence[Pass], name: str = "Sequential", opt_level: int = 0,
                 required: Iterable[str] = ()):
        passes = list(passes)
        for i, p in enumerate(passes):
            if isinstance(p, type) and issubclass(p, Pass):
                raise KilnError(f"Sequential {name}: item {i} is the pass class {p.__name__}, "
                                f"not an instance; write {p.__name__}()")
            if not isinstance(p, Pass):
                raise KilnError(f"Sequential {name}: item {i} is not a Pass: {p!r}")
        self.passes = passes
        self.info = PassInfo(name, opt_level, tuple(required))

    def _transform(self, mod: IRModule, ctx: PassContext) -> IRModule:
        for name in self.info.required:
            mod = _run_with_required(get_pass(name), mod, ctx, (self.info.name,))
        for p in self.passes:
            if not ctx.pass_enabled(p.info):
                continue
            mod = _run_with_required(p, mod, ctx, ())
        return mod

    def __repr__(self) -> str:
        inner = ", ".join(repr(p) for p in self.passes)
        return f"Sequential({self.info.name}: [{inner}])"


def _run_with_required(p: Pass, mod: IRModule, ctx: PassContext,
                       chain: tuple[str, ...]) -> IRModule:
    """Run ``p``'s required passes (recursively, whatever their opt level), then ``p``."""
    if p.info.name in chain:
        cycle = " -> ".join((*chain, p.info.name))
        raise KilnError(f"required passes form a cycle: {cycle}")
    for name in p.info.required:
        try:
            req = get_pass(name)
        except KilnError as err:
            raise KilnError(f"pass {p.info.name} requires {name!r}: {err}") from None
        mod = _run_with_required(req, mod, ctx, (*chain, p.info.name))
    return ctx.run_pass(p, mod)


# ---------------------------------------------------------------------------------------------
# decorators
# ---------------------------------------------------------------------------------------------
def _origin(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def _instance_maker(cls: type) -> Callable[[], Pass]:
    def make() -> Pass:
        try:
            return cls()
        except TypeError as err:
            raise KilnError(
                f"pass {cls.info.name} is required by another pass but cannot be made without "
                f"arguments: {err}"
            ) from None

    return make


def _declare(obj: Any, base: type[Pass], method: str, opt_level: int, name: str | None,
             required: Iterable[str]) -> Any:
    if not isinstance(opt_level, int) or isinstance(opt_level, bool) or opt_level < 0:
        raise KilnError(f"pass opt_level must be an int >= 0, got {opt_level!r}")
    if isinstance(required, str):
        required = (required,)
    required = tuple(required)
    if inspect.isclass(obj):
        if not callable(getattr(obj, method, None)):
            raise KilnError(f"{base.__name__} class {obj.__name__} must define {method}()")
        info = PassInfo(name or obj.__name__, opt_level, required)
        if issubclass(obj, base):
            cls = obj
            cls.info = info
        else:
            ns = {"info": info, "__doc__": obj.__doc__, "__module__": obj.__module__,
                  "__qualname__": obj.__qualname__}
            cls = type(obj.__name__, (obj, base), ns)
        _register(_Declared(info, _summary(obj), _origin(obj), _instance_maker(cls)))
        return cls
    if callable(obj):
        info = PassInfo(name or obj.__name__, opt_level, required)
        wrapper = type(info.name, (base,), {
            "info": info, "__doc__": obj.__doc__, "__module__": obj.__module__,
            method: staticmethod(obj),
        })
        inst = wrapper()
        _register(_Declared(info, _summary(obj), _origin(obj), lambda: inst))
        return inst
    raise KilnError(f"{base.__name__} decorator expects a class or a function, got {obj!r}")


def _decorator(base: type[Pass], method: str) -> Callable[..., Any]:
    def decorator(obj: Any = None, *, opt_level: int = 0, name: str | None = None,
                  required: Iterable[str] = ()) -> Any:
        if obj is None:
            return lambda o: _declare(o, base, method, opt_level, name, required)
        return _declare(obj, base, method, opt_level, name, required)

    return decorator


module_pass = _decorator(ModulePass, "transform_module")
module_pass.__name__ = "module_pass"
module_pass.__doc__ = """Declare a module pass.

``@module_pass(opt_level=2, name=None, required=())`` on a class defining
``transform_module(self, mod, ctx) -> IRModule`` makes it a :class:`Pass` subclass (the name
defaults to the class name, the summary is the docstring's first line); on a function
``fn(mod, ctx) -> IRModule`` it returns a Pass instance.
"""

function_pass = _decorator(FunctionPass, "transform_function")
function_pass.__name__ = "function_pass"
function_pass.__doc__ = """Declare a pass that runs on every graph Function of the module.

The class defines ``transform_function(self, func, mod, ctx) -> Function`` (or the decorated
function is ``fn(func, mod, ctx) -> Function``); ``mod`` is the module the pass was given.
"""

prim_func_pass = _decorator(PrimFuncPass, "transform_function")
prim_func_pass.__name__ = "prim_func_pass"
prim_func_pass.__doc__ = """Declare a pass that runs on every tir PrimFunc of the module.

The class defines ``transform_function(self, func, mod, ctx) -> PrimFunc`` (or the decorated
function is ``fn(func, mod, ctx) -> PrimFunc``).
"""
