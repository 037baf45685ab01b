"""ONNX schemas as legalization sees them: a node's type binding and the spec's allowed types.

A *binding* maps each type constraint of an operator's schema (``T``, ``T1``, ``B``...) to the type
a node gives it, as ONNX type strings (``tensor(float)``, ``seq(tensor(int64))``): the strings
ONNX schemas and ONNX Runtime's kernel registry both use, so no translation sits between them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import onnx
import onnx.defs
import onnx_ir as ir

Binding = dict[str, str]


def tensor_type(dtype: ir.DataType) -> str:
    """``ir.DataType.FLOAT`` -> ``tensor(float)``."""
    return f"tensor({dtype.name.lower()})"


def tensor_dtype(type_string: str) -> ir.DataType | None:
    """``tensor(float)`` -> ``ir.DataType.FLOAT``; None for sequences, optionals and unknown names."""
    if not (type_string.startswith("tensor(") and type_string.endswith(")")):
        return None
    name = type_string[len("tensor(") : -1].upper()
    return ir.DataType.__members__.get(name)


def type_string(type_: ir.TypeProtocol | None) -> str | None:
    """The ONNX type string of an onnx_ir type, e.g. ``seq(tensor(float))``; None when unknown."""
    if type_ is None:
        return None
    if isinstance(type_, ir.TensorType):
        return tensor_type(type_.dtype)
    if isinstance(type_, ir.SequenceType):
        inner = type_string(type_.elem_type)
        return f"seq({inner})" if inner else None
    if isinstance(type_, ir.OptionalType):
        inner = type_string(type_.elem_type)
        return f"optional({inner})" if inner else None
    return None


@functools.cache
def schema(op_type: str, opset: int, domain: str) -> onnx.defs.OpSchema | None:
    """The schema of `op_type` in force at `opset` of `domain`, or None when onnx does not know it."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


@functools.cache
def allowed_types(op_schema: onnx.defs.OpSchema) -> Mapping[str, frozenset[str]]:
    """Type constraint name -> the type strings the spec allows for it."""
    return {c.type_param_str: frozenset(c.allowed_type_strs) for c in op_schema.type_constraints}


def node_binding(
    op_schema: onnx.defs.OpSchema, inputs: Sequence[str | None], outputs: Sequence[str | None]
) -> tuple[Binding, dict[str, set[str]]]:
    """Bind the schema's type constraints to the given input/output type strings (None = absent/unknown).

    Returns the binding (each constraint's first type) and the constraints whose values disagree,
    with all their types. Formal parameters with a literal type (``tensor(int64)``) bind nothing;
    nor does a heterogeneous variadic parameter, whose members may differ by design.
    """
    constraints = allowed_types(op_schema)
    seen: dict[str, set[str]] = {}
    binding: Binding = {}
    for formals, actuals in ((op_schema.inputs, inputs), (op_schema.outputs, outputs)):
        for index, formal in enumerate(formals):
            if formal.type_str not in constraints:
                continue
            variadic = formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic
            if variadic and not formal.is_homogeneous:
                continue
            members = actuals[index:] if variadic else actuals[index : index + 1]
            for member in members:
                if member is not None:
                    binding.setdefault(formal.type_str, member)
                    seen.setdefault(formal.type_str, set()).add(member)
    return binding, {name: types for name, types in seen.items() if len(types) > 1}


def formal_constraint(op_schema: onnx.defs.OpSchema, index: int, *, output: bool) -> str | None:
    """The type constraint name of the `index`-th actual input (or output), following variadics."""
    formals = op_schema.outputs if output else op_schema.inputs
    if not formals:
        return None
    formal = formals[min(index, len(formals) - 1)]
    if index >= len(formals) and formal.option != onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return None
    if formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic and not formal.is_homogeneous:
        return None
    return formal.type_str if formal.type_str in allowed_types(op_schema) else None


def spec_violations(op_schema: onnx.defs.OpSchema, binding: Mapping[str, str]) -> list[str]:
    """Constraints whose bound type the spec does not allow, as ``T=tensor(bfloat16)``."""
    constraints = allowed_types(op_schema)
    return [f"{name}={bound}" for name, bound in binding.items() if bound not in constraints.get(name, {bound})]
