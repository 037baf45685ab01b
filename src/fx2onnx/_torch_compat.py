"""torch.onnx.export's arguments that fx2onnx takes so that switching exporters is one line.

- ``f`` is the third positional argument, as in torch (a mapping there is fx2onnx's older ``kwargs``).
- A dict as the last element of ``args`` holds keyword arguments when no ``kwargs`` are given (torch's
  convention: ``export(m, (x, {"mask": mask}))`` calls ``m(x, mask=mask)``; an empty dict last means none), unless
  its keys are not parameters of ``forward`` (then it is a positional dict input, as fx2onnx always took it).
- ``dynamic_shapes`` may name axes with strings (``{0: "batch"}``, ``("batch", None)``, nested too): each becomes
  ``Dim.DYNAMIC`` for torch.export and the name its ONNX dim_param (as torch.onnx does).
- ``dynamic_axes`` (TorchScript-era, still accepted by torch's dynamo path) becomes ``dynamic_shapes``:
  every listed axis is ``Dim.DYNAMIC``; an axis given a name gets it as its ONNX dim_param, on the
  inputs (and every value sharing that size) and on the outputs named in ``dynamic_axes``.
- ``f`` may be a binary file object (``io.BytesIO``), as torch.onnx's legacy callers pass it.
- ``keep_initializers_as_inputs=True`` lists the weights among the saved model's inputs too (as torch does);
  ``export_params=False`` saves them as inputs only, without their data (what torch's TorchScript exporter made,
  a model that runs when fed the weights; torch's dynamo path writes a model with undefined weights instead).
- A ``torch.onnx.ExportableModule`` given without inputs supplies them (and its input and output names and dynamic
  shapes where the call gives none), as in torch.
- ``model`` may be a plain function (wrapped in a module whose ``forward`` has its signature); a ScriptModule or
  ScriptFunction is refused with the way out (torch.export cannot read TorchScript).
- ``opset_version`` below 11 is refused with the way out (torch's dynamo path writes opset 18 for it); 11 to 17 give
  a model of that opset, adapted op by op (:mod:`fx2onnx._finalize.opset_down`).
- A model in training mode is exported as it is, with a warning (as torch does): dropout and batch norm then
  compute what training does.
- ``dynamo=False`` asks for a TorchScript export: refused with the reason. Options torch's dynamo path ignores
  (``training``, ``operator_export_type``, ``do_constant_folding``, ``custom_opsets``, ``export_modules_as_functions``,
  ``autograd_inlining``) are ignored here too, with a warning when not at their defaults; so is ``profile`` (torch
  profiles its export with it), which changes nothing in the model either.
  ``verbose`` is read, as torch's dynamo path does: ``verbose=True`` shows the export's progress.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO

import onnx_ir as ir
import torch
import torch.utils._pytree as pytree

from fx2onnx.errors import ExportError

DynamicAxes = Mapping[str, Mapping[int, str] | Sequence[int]]

# torch.onnx.export's options that only its TorchScript exporter reads, with their defaults.
IGNORED_OPTIONS: dict[str, Any] = {
    "profile": False,
    "training": torch.onnx.TrainingMode.EVAL,
    "operator_export_type": torch.onnx.OperatorExportTypes.ONNX,
    "do_constant_folding": True,
    "custom_opsets": None,
    "export_modules_as_functions": False,
    "autograd_inlining": True,
}


def split_f_and_kwargs(
    f: str | os.PathLike[str] | BinaryIO | Mapping[str, Any] | None, kwargs: Mapping[str, Any] | None
) -> tuple[str | os.PathLike[str] | BinaryIO | None, dict[str, Any]]:
    """torch's third positional argument is the file; fx2onnx's used to be `kwargs` (a mapping): both work."""
    if isinstance(f, Mapping):
        if kwargs is not None:
            raise TypeError("export() got keyword arguments twice: a mapping as third argument and kwargs=")
        return None, dict(f)
    return f, dict(kwargs or {})


def check_list_args(model: Any, args: Any) -> None:
    """torch.onnx passes a list `args` to the model as one argument (torchvision's detection models take a list of
    images); a list that only binds as several arguments is refused with the way out, not as a missing argument."""
    if not isinstance(args, list) or isinstance(model, torch.export.ExportedProgram):
        return
    try:
        signature = inspect.signature(model.forward if isinstance(model, torch.nn.Module) else model)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(args)
    except TypeError:
        try:
            signature.bind(*args)
        except TypeError:
            return
        raise TypeError(
            f"args is a list of {len(args)}: torch.onnx.export passes a list to the model as one argument, and "
            f"{type(model).__name__}.forward takes {len(args)}\n  remedy: give them as a tuple, args=(x, y, ...)"
        ) from None


def split_kwargs_from_args(
    model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """torch.onnx's convention: with no `kwargs`, a dict as the last element of `args` holds the keyword arguments.

    torch.onnx applies it to every dict; fx2onnx also took a dict there as a positional input (a model whose
    ``forward(self, inputs: dict)``): that reading is kept when the dict's keys do not bind as keyword arguments.
    """
    if kwargs or not args or not isinstance(args[-1], dict):
        return args, kwargs
    *positional, last = args
    if not last:
        return tuple(positional), {}  # torch's `(x, {...}, {})`: the empty dict says "no keyword arguments"
    if not all(isinstance(key, str) for key in last):
        return args, kwargs
    forward = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):
        return tuple(positional), dict(last)
    try:
        signature.bind(*positional, **last)
    except TypeError:
        try:
            signature.bind(*args)
        except TypeError:
            return tuple(positional), dict(last)  # neither binds: let capture name torch's reading's error
        return args, kwargs
    return tuple(positional), dict(last)


def exportable_module_arguments(
    model: Any,
    args: Any,
    kwargs: Mapping[str, Any] | None,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    dynamic_shapes: Any,
) -> tuple[Any, Mapping[str, Any] | None, Sequence[str] | None, Sequence[str] | None, Any]:
    """A ``torch.onnx.ExportableModule`` exported without inputs (``torch.onnx.export(module)``) gives its own: its
    ``example_arguments()``, and ``input_names()``, ``output_names()``, ``dynamic_shapes()`` where the call gives
    none, as torch.onnx reads them."""
    exportable = getattr(torch.onnx, "ExportableModule", None)
    if exportable is None or not isinstance(model, exportable) or args or kwargs:
        return args, kwargs, input_names, output_names, dynamic_shapes
    args, kwargs = model.example_arguments()
    if input_names is None:
        input_names = model.input_names()
    if output_names is None:
        output_names = model.output_names()
    if dynamic_shapes is None:
        dynamic_shapes = model.dynamic_shapes()
    return args, kwargs, input_names, output_names, dynamic_shapes


def check_old_opset(opset_version: Any, lowest: int) -> None:
    """An opset below the oldest fx2onnx writes, refused with what to pass instead (torch.onnx.export's dynamo path
    writes opset 18 for it, with a log message; legacy calls say 11 or 12 most often, older ones 9 or 10)."""
    if isinstance(opset_version, int) and not isinstance(opset_version, bool) and 0 < opset_version < lowest:
        raise ExportError(
            f"opset_version={opset_version}: fx2onnx writes opset {lowest} to the newest (ONNX Runtime runs them "
            f"all; torch.onnx.export(dynamo=True) writes opset 18 for it)\n  remedy: leave opset_version out (18), "
            f"or pass opset_version={lowest} for the oldest opset fx2onnx writes"
        )


def as_module(model: Any) -> Any:
    """`model` as torch.export takes it: a plain function becomes a module calling it (its ``forward`` has the
    function's signature, so that dynamic_shapes and dynamic_axes name its parameters); TorchScript is refused."""
    if isinstance(model, (torch.jit.ScriptModule, torch.jit.ScriptFunction)):
        raise TypeError(
            f"{type(model).__name__}: fx2onnx captures the model with torch.export, which cannot read TorchScript\n"
            "  remedy: pass the torch.nn.Module (or function) before torch.jit.script / torch.jit.trace, or call "
            "torch.onnx.export(..., dynamo=False) for TorchScript"
        )
    if isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)) or not callable(model):
        return model

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        return model(*args, **kwargs)

    signature = inspect.signature(model)
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    forward.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self_parameter, *signature.parameters.values()]
    )
    name = getattr(model, "__name__", "")
    return type(name if name.isidentifier() else "Function", (torch.nn.Module,), {"forward": forward})()


# What a module in training mode captures as (eval mode gives aten.dropout / aten.batch_norm with training False).
_TRAINING_OPS = frozenset(
    {
        "aten.native_dropout.default",
        "aten.bernoulli.default",
        "aten.bernoulli.p",
        "aten.bernoulli_.float",
        "aten._native_batch_norm_legit.default",
        "aten._native_batch_norm_legit_functional.default",
        "aten._batch_norm_with_update.default",
        "aten._batch_norm_with_update_functional.default",
    }
)
_TRAINING_FLAG = {"aten.dropout.default": 2, "aten.batch_norm.default": 5, "aten.instance_norm.default": 5}


def warn_if_training(model: Any, graph_module: torch.fx.GraphModule) -> None:
    """A model left in training mode (model.eval() forgotten) whose graph computes what training does (dropout,
    batch norm on the batch's statistics), said as torch.onnx.export says it; a model whose code does not depend
    on the mode exports the same either way, without a warning."""
    if not isinstance(model, torch.nn.Module) or not model.training:
        return
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            target = str(node.target)
            flag = _TRAINING_FLAG.get(target)
            if target in _TRAINING_OPS or (flag is not None and len(node.args) > flag and node.args[flag] is True):
                warnings.warn(
                    f"{type(model).__name__} is in training mode: the ONNX model computes what training does "
                    f"({target}: dropout drops, batch norm uses the batch's statistics)\n  remedy: call model.eval() "
                    "before export for inference",
                    stacklevel=3,
                )
                return


def _is_axes(spec: Any) -> bool:
    """Whether `spec` describes one tensor's axes (``{0: Dim}``, ``(Dim, None)``), not a container of inputs."""
    axis_like = (str, int, torch.export.Dim, type(torch.export.Dim.DYNAMIC))
    if isinstance(spec, Mapping):
        return bool(spec) and all(
            isinstance(k, int) and (v is None or isinstance(v, axis_like)) for k, v in spec.items()
        )
    if isinstance(spec, (list, tuple)):
        return all(v is None or isinstance(v, axis_like) for v in spec)
    return False


def axis_names_to_dims(dynamic_shapes: Any, shared: Mapping[str, Any] | None = None) -> Any:
    """`dynamic_shapes` for torch.export: every axis named by a string becomes ``Dim.DYNAMIC`` (the name is kept
    apart, by :func:`fx2onnx._capture_dims.dim_names`, for the ONNX dim_param), or, for a name in `shared` (one
    several axes share), that name's ``Dim``: the axes are one dim, as the user wrote, not dims the model's code
    happens to make equal (which torch.export would check, and fx2onnx warn about, as the model's assumption)."""
    shared = shared or {}

    def convert(spec: Any) -> Any:
        if isinstance(spec, str):
            return shared.get(spec, torch.export.Dim.DYNAMIC)
        if _is_axes(spec):
            if isinstance(spec, Mapping):
                return {axis: convert(dim) for axis, dim in spec.items()}
            return type(spec)(convert(dim) for dim in spec)
        if isinstance(spec, Mapping):
            return {key: convert(value) for key, value in spec.items()}
        if isinstance(spec, (list, tuple)) and type(spec) in (list, tuple):
            return type(spec)(convert(item) for item in spec)
        return spec

    return convert(dynamic_shapes)


def check_options(*, dynamo: bool, **ignored: Any) -> None:
    if not dynamo:
        raise ValueError(
            "dynamo=False asks for torch's TorchScript exporter; fx2onnx exports through torch.export (dynamo=True). "
            "Call torch.onnx.export for a TorchScript export."
        )
    for name, value in ignored.items():
        if name in IGNORED_OPTIONS and value != IGNORED_OPTIONS[name]:
            why = (
                "fx2onnx does not profile the export (the report, report=True, gives each stage's time)"
                if name == "profile"  # torch's dynamo path reads it: a pyinstrument profile of its export
                else "torch.onnx.export reads it only in its TorchScript exporter"
            )
            warnings.warn(f"{name}={value!r} is ignored: {why}; the model is the same either way", stacklevel=3)


def dynamic_shapes_from_axes(
    model: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    dynamic_axes: DynamicAxes,
    input_names: Sequence[str] | None,
) -> tuple[dict[str, Any], dict[tuple[int, int], str], list[str]]:
    """``dynamic_shapes`` for torch.export, (id of input tensor, dim) -> the name ``dynamic_axes`` gives, and the
    names that key the inputs.

    Keys of `dynamic_axes` name inputs by `input_names` (the model's first tensor inputs, in order) or by the
    forward method's parameter names (the inputs `input_names` leaves unnamed); keys naming outputs are left to
    :func:`name_output_axes`.
    """
    if isinstance(model, torch.export.ExportedProgram):
        raise ValueError("dynamic_axes applies to a module; an ExportedProgram already has its dynamic shapes")
    forward = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        bound = inspect.signature(forward).bind(*args, **kwargs).arguments
    except (TypeError, ValueError) as error:
        message = f"cannot match args/kwargs to {type(model).__name__}.forward for dynamic_axes: {error}"
        raise ValueError(message) from None

    # Each tensor input, in order: the parameter it belongs to, the name the graph gives it (the parameter's, or for
    # a tensor inside a nested input the parameter's and its keys', as torch.export names it: images_0, inputs_mask)
    # and whether it is that whole parameter.
    leaves: list[tuple[str, str, torch.Tensor, bool]] = []
    for parameter, value in bound.items():
        for path, leaf in pytree.tree_flatten_with_path(value)[0]:
            if isinstance(leaf, torch.Tensor):
                name = "_".join([parameter, *(_key_name(key) for key in path)])
                leaves.append((parameter, name, leaf, leaf is value))
    # input_names name the first inputs; the others keep the graph's names
    names = list(input_names or [])[: len(leaves)]
    names += [name for _, name, _, _ in leaves[len(names) :]]

    specs: dict[int, dict[int, Any]] = {}  # id of an input tensor -> its axes' spec
    axis_names: dict[tuple[int, int], str] = {}
    for name, (parameter, _, tensor, whole) in zip(names, leaves):
        axes = dynamic_axes.get(name)
        if axes is None and whole and parameter not in names:  # a parameter's name keys it when it names no input
            axes = dynamic_axes.get(parameter)
        if axes is None:
            continue
        named = dict(axes) if isinstance(axes, Mapping) else {int(axis): None for axis in axes}
        # a name stays in the spec: capture makes a name several axes share one dim (see axis_names_to_dims)
        specs[id(tensor)] = {
            int(axis) % tensor.dim(): str(axis_name) if axis_name else torch.export.Dim.DYNAMIC
            for axis, axis_name in named.items()
        }
        for axis, axis_name in named.items():
            if axis_name:
                axis_names[(id(tensor), int(axis) % tensor.dim())] = str(axis_name)
    # a parameter with a dynamic axis gets a spec of its value's structure (a list of images: a list of specs)
    shapes = {
        parameter: pytree.tree_map(lambda leaf: specs.get(id(leaf)) if isinstance(leaf, torch.Tensor) else None, value)
        if any(id(leaf) in specs for leaf in pytree.tree_leaves(value))
        else None
        for parameter, value in bound.items()
    }
    keys = [*names, *(parameter for parameter, _, _, whole in leaves if whole and parameter not in names)]
    return shapes, axis_names, keys


def _key_name(key: Any) -> str:
    """A pytree key as torch.export spells it in an input's name (``images_0``, ``inputs_mask``)."""
    for attribute in ("key", "idx", "name"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def name_output_axes(model: ir.Model, dynamic_axes: DynamicAxes, input_names: Sequence[str]) -> None:
    """Give the outputs `dynamic_axes` names the dim_params it asks for, where the dimension is not static.

    A key that names neither an input (`input_names`: those :func:`dynamic_shapes_from_axes` matched keys to) nor
    an output is refused: its axes would silently stay static (a misspelt name, an output whose name
    `output_names` does not give).
    """
    outputs = [output.name or "" for output in model.graph.outputs]
    unknown = [key for key in dynamic_axes if key not in input_names and key not in outputs]
    if unknown:
        raise ValueError(
            f"dynamic_axes names {', '.join(map(repr, unknown))}: no input or output of the model has that name "
            f"(inputs: {', '.join(dict.fromkeys(input_names))}; outputs: {', '.join(outputs)})\n"
            "  remedy: name inputs by input_names (or forward's parameter names) and outputs by output_names"
        )
    for output in model.graph.outputs:
        axes = dynamic_axes.get(output.name or "")
        if not isinstance(axes, Mapping) or output.shape is None:
            continue
        dims = list(output.shape)
        for axis, axis_name in axes.items():
            index = int(axis) % len(dims) if dims else None
            if index is not None and axis_name and isinstance(dims[index], ir.SymbolicDim):
                dims[index] = ir.SymbolicDim(str(axis_name))
        output.shape = ir.Shape(dims)


__all__ = [
    "as_module",
    "axis_names_to_dims",
    "check_list_args",
    "check_old_opset",
    "check_options",
    "dynamic_shapes_from_axes",
    "exportable_module_arguments",
    "name_output_axes",
    "split_f_and_kwargs",
    "split_kwargs_from_args",
    "warn_if_training",
]
