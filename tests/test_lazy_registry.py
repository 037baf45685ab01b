"""The default registry computes each implementation's signature (its type constraints, read from its annotations)
when dispatch first asks for it, not when the lowering is defined: the first export in a process no longer pays for
~1,000 signatures it does not look at, and dispatch sees the signatures it saw before."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import onnxscript
from onnxscript.values import TracedOnnxFunction

from fx2onnx import Registry
from fx2onnx._emit.recorder import LazyTracedOnnxFunction


def test_lazy_signatures_are_the_eager_ones() -> None:
    lazy = {
        id(implementation.function): implementation.function
        for target in Registry.default().targets()
        for implementation in Registry.default().overloads(target)
        if isinstance(implementation.function, LazyTracedOnnxFunction)
    }
    assert len(lazy) > 400  # fx2onnx's rules (and torchlib's, when the registry imported torchlib first)
    for function in lazy.values():
        eager = TracedOnnxFunction(function.opset, function.func)
        assert function.op_signature == eager.op_signature, function.name
        assert function.name == eager.name and function.op_schema == eager.op_schema


def test_a_first_export_reads_few_signatures() -> None:
    """In a fresh process, exporting a small model computes the signatures of the ops it dispatches, not all; those
    of torchlib's trace-only functions are lazy too, and every signature is the eager one."""
    script = textwrap.dedent(
        """
        import torch
        from onnxscript.values import TracedOnnxFunction
        import fx2onnx
        from fx2onnx._emit.recorder import LazyTracedOnnxFunction
        from fx2onnx._registry import global_registry

        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.LayerNorm(4)).eval()
        fx2onnx.export(model, (torch.randn(2, 4),))
        registry = global_registry()
        functions = {
            id(i.function): i.function
            for target in registry.targets()
            for i in registry.overloads(target)
            if isinstance(i.function, LazyTracedOnnxFunction)
        }
        read = sum(1 for f in functions.values() if f._signature is not None)
        torchlib = sum(1 for f in functions.values() if f.opset.domain != "pkg.fx2onnx")
        eager = {key: TracedOnnxFunction(f.opset, f.func).op_signature for key, f in functions.items()}
        differ = [f.name for key, f in functions.items() if f.op_signature != eager[key]]
        print(read, len(functions), torchlib, len(differ))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    read, total, torchlib, differ = map(int, result.stdout.split()[-4:])
    assert total > 700 and torchlib > 300
    assert 0 < read < 60, (read, total)
    assert differ == 0


def test_user_functions_keep_eager_signatures() -> None:
    """What users register is wrapped as before (its annotations are checked when it is registered)."""

    def double(x: onnxscript.FLOAT) -> onnxscript.FLOAT:
        return x

    registry = Registry.default()
    implementation = registry.register("aten::relu", double)
    assert not isinstance(implementation.function, LazyTracedOnnxFunction)
    assert implementation.function.op_signature is not None
