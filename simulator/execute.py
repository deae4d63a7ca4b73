"""Runs an executable's ATen ops on CPU buffers: the only place trnsim computes numerics.

An Executable is parsed once into a LoadedExecutable (a list of steps with their argument
builders); running it takes CPU tensors that alias device memory and returns CPU tensors.

With numerics off (NEURON_SIM_NUMERICS=off, simulator/shape_only.py) a step computes
nothing: its outputs are tensors of the declared shapes whose memory is never written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._ops import OpOverload
from trnsim.protos import executable_pb2, graph_pb2
from trnsim.simulator import dtypes, kernels, native, shape_only

MEMORY_FORMATS = {
    graph_pb2.CONTIGUOUS_FORMAT: torch.contiguous_format,
    graph_pb2.CHANNELS_LAST: torch.channels_last,
    graph_pb2.CHANNELS_LAST_3D: torch.channels_last_3d,
    graph_pb2.PRESERVE_FORMAT: torch.preserve_format,
}
LAYOUTS = {graph_pb2.STRIDED: torch.strided, graph_pb2.SPARSE_COO: torch.sparse_coo}
CPU = torch.device("cpu")


def _settle_vector_math() -> None:
    """The first vectorised math call (MKL's VML: sqrt, exp...) in a process with two or more
    CPU threads can answer with only about 14 correct bits: on this project's 2-core machine,
    the first `torch.sqrt` of a 64x64 float32 tensor was off by up to 1.2e-3 in 2 to 5 of
    every 30 fresh processes, every later call exact; with MKL_NUM_THREADS=1, or after any
    earlier VML call, 0 of 30 (torch 2.13.0's CPU build, MKL 2024.2). The simulator computes
    the device's numbers with these kernels, so it makes that first call itself, on throwaway
    values, before any executable runs (and before the user's own CPU math, which this fixes
    too)."""
    torch.sqrt(torch.ones(64))
    torch.exp(torch.ones(64))


_settle_vector_math()


class ExecutionError(RuntimeError):
    """An op failed while the executable ran. Unrecoverable for this launch; the message
    names the op (and the user's source line when the executable carries debug info)."""

    def __init__(self, op: str, node: int, cause: BaseException, where: str = "") -> None:
        self.op, self.node, self.cause = op, node, cause
        at = f" (issued at {where})" if where else ""
        super().__init__(f"{op} failed on the neuron device{at}: {cause}")


def torch_dtype(dtype: int) -> torch.dtype:
    return getattr(torch, dtypes.name(dtype))  # type: ignore[no-any-return]


def resolve_op(name: str) -> OpOverload:
    """ "aten::add.Tensor" -> torch.ops.aten.add.Tensor (an OpOverload)."""
    namespace, rest = name.split("::", 1)
    op_name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), op_name)
    op: OpOverload = getattr(packet, overload or "default")
    return op


Inputs = Sequence[torch.Tensor]  # CPU tensors over the executable's inputs' device memory
Scalars = Sequence[float]  # the runtime scalars (Argument.scalar_input), in order
Env = dict[tuple[int, int], Any]  # (node, output index) -> value
Builder = Callable[[Inputs, Env, Scalars], Any]  # (inputs, env, scalars) -> value


def _builder(arg: graph_pb2.Argument) -> Builder:
    """A function that produces the argument's runtime value from the environment."""
    kind = arg.WhichOneof("value")
    if kind == "tensor":
        ref = arg.tensor
        if ref.WhichOneof("kind") == "input":
            i = ref.input
            return lambda inputs, env, scalars: inputs[i]
        key = (ref.node_output.node, ref.node_output.output)
        return lambda inputs, env, scalars: env[key]
    if kind == "scalar_input":
        index = arg.scalar_input
        return lambda inputs, env, scalars: scalars[index]
    if kind == "list":
        items = [_builder(a) for a in arg.list.items]
        return lambda inputs, env, scalars: [b(inputs, env, scalars) for b in items]
    constant = _constant(arg, kind)
    return lambda inputs, env, scalars: constant


def _constant(arg: graph_pb2.Argument, kind: str | None) -> Any:
    if kind is None or kind == "none":
        return None
    if kind == "dtype":
        return torch_dtype(arg.dtype)
    if kind == "memory_format":
        return MEMORY_FORMATS[arg.memory_format]
    if kind == "layout":
        return LAYOUTS[arg.layout]
    if kind == "device":
        return CPU  # device memory is host memory: factories build on the CPU
    if kind == "complex":
        return complex(arg.complex.real, arg.complex.imag)
    return getattr(arg, kind)


def _first_tensor_builder(node: graph_pb2.Node) -> Builder | None:
    for a in node.args:
        if a.WhichOneof("value") == "tensor":
            return _builder(a)
    return None


def _wrapped_number(b: Builder, like: Builder | None) -> Builder:
    """A Python number passed where the schema takes a Tensor (PyTorch wraps it): a 0-dim
    tensor of the dtype type promotion gives the number next to the op's first tensor."""

    def build(inputs: Inputs, env: Env, scalars: Scalars) -> Any:
        value = b(inputs, env, scalars)
        if isinstance(value, torch.Tensor) or value is None:
            return value
        other = like(inputs, env, scalars) if like is not None else None
        dtype = torch.result_type(other, value) if other is not None else None
        return torch.tensor(value, dtype=dtype)

    return build


class _Step:
    """One ATen op of the executable, ready to call."""

    def __init__(self, node_index: int, node: graph_pb2.Node) -> None:
        self.node = node_index
        self.name = node.op
        self.op = resolve_op(node.op)
        schema_args = {a.name: a for a in self.op._schema.arguments}
        self.positional: list[Builder] = []
        self.keywords: list[tuple[str, Builder]] = []
        # Numbers where the schema takes a Tensor: most ops take them as they are (as the
        # CPU got them); the others get a 0-dim tensor (see call()).
        self.number_positions: list[int] = []
        self.number_keywords: list[int] = []
        self.first_tensor = _first_tensor_builder(node)
        self.node_args = list(node.args)  # (what the executable's program is generated from)
        self.wrapped = False  # its numbers given as 0-dim tensors (see call())
        for a in node.args:
            declared = schema_args.get(a.name)
            number = (
                declared is not None
                and str(declared.type) == "Tensor"
                and a.WhichOneof("value") != "tensor"
            )
            if declared is not None and declared.kwarg_only:
                if number:
                    self.number_keywords.append(len(self.keywords))
                self.keywords.append((a.name, _builder(a)))
            else:
                if number:
                    self.number_positions.append(len(self.positional))
                self.positional.append(_builder(a))
        self.generator_arg = "generator" in {a.name for a in self.op._schema.arguments}
        # What runs: the C++ callable behind the OpOverload (skips a frame), or our own
        # kernel where the CPU has none for a dtype a device must take.
        self.call_op = kernels.GAPS.get(node.op) or self.op._op
        self.out_op = _out_variant(self.op) if len(node.outputs) == 1 and not node.aliases else None
        self.n_outputs = len(node.outputs)
        returns = self.op._schema.returns
        self.one_tensor = len(returns) == 1 and str(returns[0].type) == "Tensor"
        # The layout the graph declares for each output (the Meta kernel's strides). The CPU
        # kernel may pick another (channels_last convolutions, layer norm's backward of a
        # transposed input); views and as_strided later in a graph rely on the declared one.
        # Outputs that alias an argument are the argument as it is.
        aliased = {a.output for a in node.aliases}
        self.declared: list[tuple[tuple[int, ...], tuple[int, ...]] | None] = [
            (tuple(o.shape), tuple(o.strides))
            if j not in aliased and all(s >= 0 for s in o.shape)
            else None
            for j, o in enumerate(node.outputs)
        ]
        self.conforms = any(d is not None for d in self.declared)
        # For shape-only runs: each output's dtype, the argument an output is written
        # through (in-place ops, out=), and whether the op is a view (computes nothing).
        self.dtypes = [torch_dtype(o.dtype) if o.dtype else None for o in node.outputs]
        self.arguments = [_builder(a) for a in node.args]
        self.written = {a.output: a.argument for a in node.aliases if a.writes}
        self.types = [
            (tuple(o.shape), tuple(o.strides)) if all(s >= 0 for s in o.shape) else None
            for o in node.outputs
        ]
        self.is_view = any(not a.writes for a in node.aliases)
        # The op takes exactly the graph inputs, in order, and nothing else: call op(*inputs)
        # (given as many inputs as it has positional arguments).
        self.inputs_only = (
            not self.keywords
            and not self.generator_arg
            and [a.WhichOneof("value") for a in node.args] == ["tensor"] * len(node.args)
            and [a.tensor.WhichOneof("kind") for a in node.args] == ["input"] * len(node.args)
            and [a.tensor.input for a in node.args] == list(range(len(node.args)))
        )
        self.n_positional = len(self.positional)

    def call(
        self,
        inputs: Inputs,
        env: Env,
        scalars: Scalars,
        generator: torch.Generator | None,
    ) -> Any:
        try:
            return self._call(inputs, env, scalars, generator)
        except (TypeError, RuntimeError) as e:
            if not self.refused_number(e):
                raise
            self._wrap_numbers()
            return self._call(inputs, env, scalars, generator)

    def refused_number(self, error: Exception) -> bool:
        """Whether `error` is this op refusing a number given for a Tensor argument (run it
        again with its numbers wrapped as 0-dim tensors)."""
        return (
            isinstance(error, (TypeError, RuntimeError))
            and bool(self.number_positions or self.number_keywords)
            and "Unable to cast" in str(error)
        )

    def _wrap_numbers(self) -> None:
        """This op refused a number for a Tensor argument: wrap them from now on."""
        for i in self.number_positions:
            self.positional[i] = _wrapped_number(self.positional[i], self.first_tensor)
        for i in self.number_keywords:
            name, b = self.keywords[i]
            self.keywords[i] = (name, _wrapped_number(b, self.first_tensor))
        self.number_positions, self.number_keywords = [], []
        self.wrapped = True

    def _call(
        self,
        inputs: Inputs,
        env: Env,
        scalars: Scalars,
        generator: torch.Generator | None,
    ) -> Any:
        args = [b(inputs, env, scalars) for b in self.positional]
        if self.keywords or self.generator_arg:
            kwargs = {name: b(inputs, env, scalars) for name, b in self.keywords}
            if self.generator_arg and kwargs.get("generator") is None and generator is not None:
                kwargs["generator"] = generator
            return self.call_op(*args, **kwargs)
        return self.call_op(*args)

    def shape_only(
        self, inputs: Inputs, env: Env, scalars: Scalars, generator: torch.Generator | None
    ) -> list[Any]:
        """The step with numerics off: its outputs as a flat list, made without computing
        (a view is taken for real: it computes nothing). Fresh outputs are new tensors of
        the declared layout whose memory is never touched; written ones are the argument.
        A small op over values the host supplied is computed (shape_only.computes)."""
        if self.is_view or self.name in shape_only.METADATA_ONLY:
            return _flatten(self._call(inputs, env, scalars, None))
        args = [b(inputs, env, scalars) for b in self.arguments]
        written = list(self.written.values())
        unknown = any(d is None for j, d in enumerate(self.declared) if j not in self.written)
        lacking = unknown and shape_only.computed_for_lack_of_meta(self.name)
        if lacking:
            shape_only.hooks.computed(self.name, "computed: no Meta kernel gives its sizes")
        if lacking or shape_only.computes(self.name, args, written, self.declared, self.dtypes):
            result = self.call(inputs, env, scalars, generator)
            if self.conforms:
                result = self.conform(result)
            flat = _flatten(result)
            shape_only.computed(self.name, args, written, flat)
            return flat
        assumed = shape_only.assumed_outputs(self.name, self.op, args, self.dtypes)
        if assumed is not None:
            return assumed
        outs: list[Any] = []
        for j, declared in enumerate(shape_only.as_cpu_makes(self.name, args, self.declared)):
            argument = self.written.get(j)
            if argument is not None:
                outs.append(shape_only.written(self.name, args, argument, self.types[j]))
            elif declared is not None:
                outs.append(shape_only.fresh(self.name, args, declared, self.dtypes[j]))
            else:
                outs.append(None)  # an optional output the op does not produce
        return shape_only.with_values(self.op, outs)

    def conform(self, result: Any) -> Any:
        """The result in the layout the graph declares (the Meta kernel's), as a device's
        kernel would write it: views and strides read later depend on it."""
        declared = self.declared
        if isinstance(result, torch.Tensor):
            return _conformed(result, declared[0])
        if isinstance(result, tuple) and len(result) == len(declared):
            return tuple(_conformed(r, d) for r, d in zip(result, declared, strict=True))
        return result

    def run_into(self, inputs: Inputs, env: Env, scalars: Scalars, buffer: torch.Tensor) -> None:
        """Computes straight into `buffer` (right shape and dtype) with the op's out= kernel."""
        assert self.out_op is not None, "run_into is for ops in _WRITES_OUT_IN_PLACE"
        args = [b(inputs, env, scalars) for b in self.positional]
        kwargs = {name: b(inputs, env, scalars) for name, b in self.keywords}
        ptr = buffer.data_ptr()
        self.out_op(*args, **kwargs, out=buffer)
        assert buffer.data_ptr() == ptr, f"{self.name}: out= reallocated its output"
        env[(self.node, 0)] = buffer

    def run(
        self,
        inputs: Inputs,
        env: Env,
        scalars: Scalars,
        generator: torch.Generator | None,
    ) -> None:
        result = self.call(inputs, env, scalars, generator)
        if self.conforms:
            result = self.conform(result)
        if isinstance(result, (tuple, list)):
            for j, r in enumerate(result):
                env[(self.node, j)] = r
        else:
            env[(self.node, 0)] = result


class LoadedExecutable:
    """An executable parsed for running: its ATen steps in dependency order."""

    def __init__(self, exe: executable_pb2.Executable) -> None:
        self.executable = exe
        self.key = exe.cache_key
        self.bound: LoadedExecutable | None = None  # at_size: the executable it runs as
        self.modelled_ns = exe.modelled_ns
        self.hbm_bytes = exe.hbm_bytes
        steps: dict[int, _Step] = {}
        for ins in sorted(exe.instructions, key=lambda i: i.id):
            for node_index, node in zip(ins.nodes, ins.ops, strict=True):
                steps[node_index] = _Step(node_index, node)
        self.steps = [steps[i] for i in sorted(steps)]  # program order is a topological order
        self.outputs = [
            (-1, r.input)
            if r.WhichOneof("kind") == "input"
            else (r.node_output.node, r.node_output.output)
            for r in exe.graph.outputs
        ]
        self.engine_ns = {
            executable_pb2.Engine.Name(p.engine).lower(): p.busy_ns
            for p in exe.engines
            if p.engine != executable_pb2.NONE
        }
        # (what a launch costs the timeline, as the C++ accounting reads it: accounting.h)
        self.cost = native.module().Cost(self.modelled_ns, self.hbm_bytes, self.engine_ns)
        self.locations = list(exe.debug.graph.node_locations)
        # Graph outputs an out= kernel can write straight into the caller's memory.
        self.writable = {
            node: k
            for k, (node, j) in enumerate(self.outputs)
            if node >= 0 and j == 0 and steps[node].out_op is not None
        }
        # One op whose outputs are the graph's outputs in order (every eager executable):
        # its result is returned as the op returns it, without an environment.
        self.single = len(self.steps) == 1 and self.outputs == [
            (self.steps[0].node, j) for j in range(self.steps[0].n_outputs)
        ]
        self._program: Program | None = None  # made on the first run with numerics

    def run(
        self,
        inputs: Inputs,
        scalars: Scalars = (),
        generator: torch.Generator | None = None,
        into: Sequence[torch.Tensor] | None = None,
    ) -> list[Any]:
        """The graph's outputs. With `into` (the caller's buffer per output), the outputs an
        out= kernel can compute are written there: those results are the buffers."""
        if not shape_only.NUMERICS.on:
            return self._run_shapes(inputs, scalars, generator, into)
        if self.single:  # (every eager op: kept short)
            step = self.steps[0]
            try:
                if step.inputs_only and len(inputs) == step.n_positional:
                    result = step.call_op(*inputs)
                else:
                    result = step.call(inputs, {}, scalars, generator)
            except Exception as e:
                raise ExecutionError(step.name, step.node, e, self._where(step.node)) from e
            if type(result) is not torch.Tensor:
                return _flatten(step.conform(result) if step.conforms else result)
            declared = step.declared[0]  # (conform(), its one-tensor case inline)
            if declared is not None and result.stride() != declared[1]:
                result = _conformed(result, declared)
            return [result]
        program = self._program
        if program is None:
            program = self._program = _program(self)
        return program(inputs, scalars, generator, into)

    def _failed(
        self,
        at: int,
        error: Exception,
        inputs: Inputs,
        env: Env,
        scalars: Scalars,
        generator: torch.Generator | None,
        into: Sequence[torch.Tensor] | None,
    ) -> list[Any]:
        """Step `at` of the program raised: an op refusing a number for a Tensor argument is
        run again with it wrapped, as _Step.call does, and the rest of the run goes step by
        step; any other failure is the op's."""
        step = self.steps[at]
        if step.refused_number(error):
            self._program = None  # (made again, with that step run by _Step.run)
            return self._run_steps(at, inputs, env, scalars, generator, into)
        raise ExecutionError(step.name, step.node, error, self._where(step.node)) from error

    def _run_steps(
        self,
        start: int,
        inputs: Inputs,
        env: Env,
        scalars: Scalars,
        generator: torch.Generator | None,
        into: Sequence[torch.Tensor] | None,
    ) -> list[Any]:
        """The steps from `start` on, one by one (what the program does, interpreted)."""
        writable = self.writable if into is not None else {}
        for step in self.steps[start:]:
            try:
                k = writable.get(step.node)
                if k is not None and into is not None:
                    step.run_into(inputs, env, scalars, into[k])
                else:
                    step.run(inputs, env, scalars, generator)
            except Exception as e:
                raise ExecutionError(step.name, step.node, e, self._where(step.node)) from e
        return [inputs[i] if n == -1 else env[(n, i)] for n, i in self.outputs]

    def _run_shapes(
        self,
        inputs: Inputs,
        scalars: Scalars,
        generator: torch.Generator | None,
        into: Sequence[torch.Tensor] | None,
    ) -> list[Any]:
        """run() with numerics off: the same outputs, of the same shapes, computed only
        where shape_only.computes says. With `into`, every output is the caller's buffer
        (a computed one copied there)."""
        env: Env = {}
        for step in self.steps:
            if not self.single:  # (one op's executable: its caller's line is the op's)
                shape_only.issued.where = self._where(step.node)
            try:
                result = step.shape_only(inputs, env, scalars, generator)
            except Exception as e:
                raise ExecutionError(step.name, step.node, e, self._where(step.node)) from e
            finally:
                shape_only.issued.where = ""
            if self.single:
                return result
            for j, r in enumerate(result):
                env[(step.node, j)] = r
        outs = [inputs[i] if n == -1 else env[(n, i)] for n, i in self.outputs]
        if into is not None:
            outs = [
                o if b is None else shape_only.settle(b, o) for b, o in zip(into, outs, strict=True)
            ]
        return outs

    def at_size(self, graph: graph_pb2.Graph, debug: graph_pb2.GraphDebug) -> LoadedExecutable:
        """This executable run at sizes inside those it was compiled at (a shape bucket's
        upper bound, client/modes/compiled.py): `graph` is the same program recorded at the real
        sizes. The numerics are computed at those sizes, its ops in program order; the time,
        engine use and HBM traffic are this executable's, as the chip runs the program
        compiled for the bound with the lanes past the real size masked (XLA's bounded
        dynamic shapes)."""
        exe = executable_pb2.Executable(
            format_version=self.executable.format_version,
            compiler_version=self.executable.compiler_version,
            target=self.executable.target,
            cache_key=self.key,
            graph=graph,
            modelled_ns=self.modelled_ns,
            hbm_bytes=self.hbm_bytes,
        )
        exe.engines.extend(self.executable.engines)
        exe.debug.graph.CopyFrom(debug)
        for i, node in enumerate(graph.nodes):
            exe.instructions.add(id=i, ops=[node], nodes=[i])
        loaded = LoadedExecutable(exe)
        loaded.bound = self
        return loaded

    def _where(self, node: int) -> str:
        if node < len(self.locations) and self.locations[node].file:
            loc = self.locations[node]
            return f"{loc.file}:{loc.line}"
        return ""


# An executable's steps as one Python function: (inputs, scalars, generator, into) -> outputs.
Program = Callable[
    [Inputs, Scalars, "torch.Generator | None", "Sequence[torch.Tensor] | None"], list[Any]
]


def _program(exe: LoadedExecutable) -> Program:
    """The executable's steps as one straight-line function: each op called with its
    arguments read where _builder reads them, its result conformed and stored as _Step.run
    does, or written into the caller's buffer as _Step.run_into does. What a step-by-step
    run pays per op in Python (builders, dispatch through _Step) is paid once, here. A
    step whose numbers are wrapped, or that takes the generator, runs through _Step."""
    names: dict[str, Any] = {"_conformed": _conformed, "_store": _store, "exe": exe}
    body: list[str] = []
    for k, step in enumerate(exe.steps):
        body.append(f"at = {k}")
        node = step.node
        j = exe.writable.get(node)
        plain = not step.wrapped and not step.generator_arg
        if j is not None:
            names[f"out{k}"] = step.out_op
            call = _call_source(step, names, k)
            body += [
                "if into is not None:",
                f"    b = into[{j}]",
                "    p = b.data_ptr()",
                f"    out{k}({call}, out=b)"
                if plain
                else f"    steps[{k}].run_into(inputs, env, scalars, b)",
                f"    assert b.data_ptr() == p, '{step.name}: out= reallocated its output'",
                f"    env[({node}, 0)] = b",
                "else:",
            ]
            indent = "    "
        else:
            indent = ""
        if not plain:
            body.append(f"{indent}steps[{k}].run(inputs, env, scalars, generator)")
            continue
        names[f"op{k}"] = step.call_op
        body.append(f"{indent}r = op{k}({_call_source(step, names, k)})")
        declared = step.declared[0] if step.declared else None
        if step.conforms and step.one_tensor and declared is not None:
            names[f"d{k}"] = declared
            body += [
                f"{indent}if r.stride() != d{k}[1]:",
                f"{indent}    r = _conformed(r, d{k})",
            ]
        elif step.conforms:
            body.append(f"{indent}r = steps[{k}].conform(r)")
        if step.one_tensor:
            body.append(f"{indent}env[({node}, 0)] = r")
        else:
            body.append(f"{indent}_store(env, {node}, r)")
    outputs = ", ".join(f"inputs[{i}]" if n == -1 else f"env[({n}, {i})]" for n, i in exe.outputs)
    names["steps"] = exe.steps
    source = "\n".join(
        [
            "def program(inputs, scalars, generator, into):",
            "    env = {}",
            "    at = 0",
            "    try:",
            *(f"        {line}" for line in body),
            "    except Exception as e:",
            "        return exe._failed(at, e, inputs, env, scalars, generator, into)",
            f"    return [{outputs}]",
        ]
    )
    exec(compile(source, f"<executable {exe.key[:12]}>", "exec"), names)  # noqa: S102
    program: Program = names["program"]
    return program


def _call_source(step: _Step, names: dict[str, Any], k: int) -> str:
    """The step's arguments as source: positional, then keywords (what _Step._call passes)."""
    positional = [a for a in step.node_args if not _keyword(step, a.name)]
    keywords = [a for a in step.node_args if _keyword(step, a.name)]
    parts = [_source(a, names, f"c{k}_{i}") for i, a in enumerate(positional)]
    parts += [f"{a.name}={_source(a, names, f'c{k}_k{i}')}" for i, a in enumerate(keywords)]
    return ", ".join(parts)


def _keyword(step: _Step, name: str) -> bool:
    return any(n == name for n, _ in step.keywords)


def _source(arg: graph_pb2.Argument, names: dict[str, Any], constant: str) -> str:
    """Where _builder reads the argument's value, as an expression."""
    kind = arg.WhichOneof("value")
    if kind == "tensor":
        ref = arg.tensor
        if ref.WhichOneof("kind") == "input":
            return f"inputs[{ref.input}]"
        return f"env[({ref.node_output.node}, {ref.node_output.output})]"
    if kind == "scalar_input":
        return f"scalars[{arg.scalar_input}]"
    if kind == "list":
        items = [_source(a, names, f"{constant}_{i}") for i, a in enumerate(arg.list.items)]
        return "[" + ", ".join(items) + "]"
    names[constant] = _constant(arg, kind)
    return constant


def _store(env: Env, node: int, result: Any) -> None:
    """An op's result in the environment, as _Step.run stores it."""
    if isinstance(result, (tuple, list)):
        for j, r in enumerate(result):
            env[(node, j)] = r
    else:
        env[(node, 0)] = result


# Structured kernels: their out= form writes an out of the right shape where it is. (Some
# other out= kernels resize `out` while they work, mse_loss's among them: never used here.)
_WRITES_OUT_IN_PLACE = frozenset(
    [
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "add",
        "sub",
        "mul",
        "div",
        "gelu",
        "silu",
        "tanh",
        "sigmoid",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "neg",
    ]
)


def _out_variant(op: OpOverload) -> OpOverload | None:
    """The op's `out` overload, for ops in _WRITES_OUT_IN_PLACE whose schema is the op's
    plus `out` (so the same arguments mean the same thing)."""
    base = op._schema.name.split("::", 1)[-1]
    if base not in _WRITES_OUT_IN_PLACE or op._schema.overload_name == "out":
        return None
    packet = getattr(torch.ops.aten, base)
    if "out" not in packet.overloads():
        return None
    names = [a.name for a in op._schema.arguments]
    types = [str(a.type) for a in op._schema.arguments]
    out: OpOverload = packet.out
    if [a.name for a in out._schema.arguments] != [*names, "out"]:
        return None
    if [str(a.type) for a in out._schema.arguments][:-1] != types:
        return None  # e.g. mul.Scalar against mul.out(Tensor other)
    return out


def _conformed(result: Any, declared: tuple[tuple[int, ...], tuple[int, ...]] | None) -> Any:
    """One output in its declared (shape, strides), copied there if the kernel chose other
    strides; anything else as it is."""
    if (
        declared is None
        or not isinstance(result, torch.Tensor)
        or result.stride() == declared[1]
        or tuple(result.shape) != declared[0]
    ):
        return result
    return torch.empty_strided(declared[0], declared[1], dtype=result.dtype).copy_(result)


def _flatten(result: Any) -> list[Any]:
    """An op's return value as the graph's flat output list (lists of tensors expanded)."""
    if isinstance(result, tuple):
        out: list[Any] = []
        for r in result:
            if isinstance(r, list):
                out.extend(r)
            else:
                out.append(r)
        return out
    if isinstance(result, list):
        return result
    return [] if result is None else [result]


def load(exe: executable_pb2.Executable) -> LoadedExecutable:
    return LoadedExecutable(exe)


def transfer(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """Host <-> device data movement: dst and src are CPU tensors (device memory is aliased)."""
    return dst.copy_(src, non_blocking=non_blocking)
