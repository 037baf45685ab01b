"""fx2onnx's own fusions into ONNX operators, written as onnxscript pattern-rewriter rules.

onnxscript's RotaryEmbedding rule only matches cos/sin computed as ``Unsqueeze(Cos(Concat(f, f)), 1)`` and
``rotate_half`` written with two ``Slice`` nodes on axis 3. fx2onnx's graphs rarely look like that: ``x.chunk(2, -1)``
becomes ``Split``, cos/sin are mostly constants after folding ([S, D] or [B, S, D] unsqueezed), and the operands of
``Add``/``Mul`` come in either order. The rules here match ``x * cos + rotate_half(x) * sin`` in all those forms and
rewrite it to ``RotaryEmbedding`` (opset 23) only when the two are provably equal:

- ``x`` is [B, H, S, D] (or [B, S, D], one head) with a static, even D; the rotation is
  ``Concat(Neg(x[..., D/2:]), x[..., :D/2])`` along the last axis, or interleaved (GPT-J's rotate_every_two)
  ``stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)``;
- cos and sin broadcast against x as [B or 1, 1, S or 1, D] (the same for every head);
- the two halves of cos's (and sin's) last axis are equal (interleaved: the neighbours 2i, 2i+1): checked bit for
  bit for constants; for computed ones proved from a ``Concat(f, f)`` on the last axis (or a constant) followed
  only by ops that keep that property.

The caches handed to ``RotaryEmbedding`` are the first halves (interleaved: the even positions), [B, S, D/2],
without ``position_ids``. A second rule folds ``Concat(RotaryEmbedding(x[..., :r]), x[..., r:])`` into
``rotary_embedding_dim=r`` (partial rotary).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from fx2onnx._constant_arrays import constant_array

ROTARY_OPSET = 23

# Ops whose output's last-axis halves (or neighbours) are equal when those of their inputs are (elementwise ops and
# ops that move or pick other axes only). Binary elementwise ops also accept an operand broadcast along the last axis.
_UNARY_ELEMENTWISE = {"Cos", "Sin", "Cast", "Neg", "Identity", "Abs", "Exp", "Sqrt", "Reciprocal", "Tanh", "Sigmoid"}
_BINARY_ELEMENTWISE = {"Mul", "Add", "Sub", "Div", "Pow"}
_MAX_PROOF_DEPTH = 24
_ROTARY_DTYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def fuse_with_onnxscript(model: ir.Model) -> None:
    """onnxscript's opset-23 fusions (RMSNormalization, GQA) without its RotaryEmbedding rule.

    That rule hands RotaryEmbedding ``Cos(freqs)`` as its caches: [1, S, D/2] when the batch shares its positions
    (transformers' LLaMA), where the operator wants x's batch, and ONNX Runtime refuses a dynamic batch above 1.
    :func:`fuse_rotary_embeddings` matches that form too and expands the caches to [B, S, D/2].
    """
    try:
        from onnxscript.rewriter.rules.fusion import _gqa, _rms_normalization
    except ImportError:  # onnxscript moved its rules: all of its fusions, then ours on what they leave
        from onnxscript.rewriter import onnx_fusions

        onnx_fusions.fuse(model)
        return
    _rms_normalization.fuse_rms_normalization(model)
    _gqa.fuse_gqa(model)


def fuse_rotary_embeddings(model: ir.Model) -> int:
    """Rewrite rotary-embedding patterns of an opset-23 model into ``RotaryEmbedding``; returns how many."""
    if model.graph.opset_imports.get("", 0) != ROTARY_OPSET:
        return 0
    if not any(node.op_type == "Neg" for node in model.graph):
        return 0  # no rotation anywhere: spare the pattern matcher's walk (tens of ms on a large graph)
    caches = _CacheBuilder(model.graph)
    rules = [SplitRotaryFusion.rule(caches), SliceRotaryFusion.rule(caches), InterleavedRotaryFusion.rule(caches)]
    full = pattern.RewriteRuleSet(rules, commute=True)
    count = full.apply_to_model(model)
    if count or any(node.op_type == "RotaryEmbedding" for node in model.graph):
        pattern.RewriteRuleSet([SlicePartialRotaryFusion.rule(), SplitPartialRotaryFusion.rule()]).apply_to_model(model)
    return count


# --- shapes and constants ------------------------------------------------------------------------------------


def _static(dim: int | ir.SymbolicDim) -> int | None:
    return dim if isinstance(dim, int) else None


def _same_dim(a: int | ir.SymbolicDim, b: int | ir.SymbolicDim) -> bool:
    """Equal for sure: the same integer, or the same named symbol (torch.export names each dynamic size once)."""
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    return a.value is not None and a.value == b.value


def _last_dim(value: ir.Value) -> int | None:
    shape = value.shape
    if shape is None or shape.rank() == 0:
        return None
    return _static(shape[-1])


def _constant(value: ir.Value | None) -> np.ndarray | None:
    """The value's array if it is a true constant (`constant_array`: readable, and not a graph input)."""
    return constant_array(value)


def _ints(value: ir.Value | None) -> list[int] | None:
    array = _constant(value)
    if array is None or array.dtype.kind not in "iu":
        return None
    return [int(v) for v in array.reshape(-1)]


def _axis(node: ir.Node, rank: int, default: int = 0) -> int:
    attribute = node.attributes.get("axis")
    axis = attribute.as_int() if attribute is not None else default
    return axis + rank if axis < 0 else axis


def _repeats_bitwise(array: np.ndarray, interleaved: bool) -> bool:
    """Whether the last axis is two equal halves (or, interleaved, equal neighbours 2i, 2i+1), bit for bit."""
    if array.ndim == 0 or array.shape[-1] % 2:
        return False
    half = array.shape[-1] // 2
    bits = np.ascontiguousarray(array).view(np.dtype(f"u{array.dtype.itemsize}"))
    if interleaved:
        return bool(np.array_equal(bits[..., 0::2], bits[..., 1::2]))
    return bool(np.array_equal(bits[..., :half], bits[..., half:]))


def _uniform_on_last_axis(value: ir.Value) -> bool:
    """Broadcast along the last axis (a scalar or last dimension 1): every position of that axis sees one value."""
    shape = value.shape
    return shape is not None and (shape.rank() == 0 or shape[-1] == 1)


def _repeats(value: ir.Value, interleaved: bool, depth: int = 0) -> bool:
    """Whether ``value[..., :D/2] == value[..., D/2:]`` for sure (D = its static, even last dimension).

    Interleaved: whether ``value[..., 0::2] == value[..., 1::2]``, proved from constants only (a repeat_interleave
    computed at run time is not recognised).
    """
    width = _last_dim(value)
    if width is None or width % 2 or depth > _MAX_PROOF_DEPTH:
        return False
    array = _constant(value)
    if array is not None:
        return _repeats_bitwise(array, interleaved)
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return False
    rank = value.shape.rank()
    inputs = node.inputs
    op = node.op_type
    if op == "Concat":
        return not interleaved and len(inputs) == 2 and inputs[0] is inputs[1] and _axis(node, rank) == rank - 1
    if op in _UNARY_ELEMENTWISE or op == "CastLike":
        return _repeats(inputs[0], interleaved, depth + 1)
    if op in _BINARY_ELEMENTWISE:
        return all(
            _uniform_on_last_axis(operand)
            or (_last_dim(operand) == width and _repeats(operand, interleaved, depth + 1))
            for operand in inputs
        )
    if op in ("Unsqueeze", "Squeeze", "Slice", "Expand", "Gather", "Transpose"):
        source = inputs[0]
        if source is None or source.shape is None or _last_dim(source) != width:
            return False
        if not _keeps_last_axis(node, source.shape.rank(), rank):
            return False
        return _repeats(source, interleaved, depth + 1)
    return False


def _keeps_last_axis(node: ir.Node, input_rank: int, output_rank: int) -> bool:
    """Whether the node's output's last axis is its first input's last axis, untouched."""
    op, inputs = node.op_type, node.inputs
    if op == "Expand":
        return True  # same last dimension (checked by the caller): nothing was broadcast along it
    if op == "Gather":
        return _axis(node, input_rank) != input_rank - 1
    if op == "Transpose":
        perm = node.attributes.get("perm")
        return perm is not None and list(perm.as_ints())[-1] == input_rank - 1
    if op in ("Unsqueeze", "Squeeze"):
        axes = _ints(inputs[1]) if len(inputs) > 1 else None
        rank = output_rank if op == "Unsqueeze" else input_rank
        return axes is not None and all(a % rank != rank - 1 for a in axes)
    # Slice: the last axis is not among the sliced ones (without an axes input, the first len(starts) are).
    if len(inputs) > 3 and inputs[3] is not None:
        axes = _ints(inputs[3])
        return axes is not None and all(a % input_rank != input_rank - 1 for a in axes)
    starts = _ints(inputs[1])
    return starts is not None and len(starts) < input_rank


def _slice_range(node: ir.Node, rank: int, width: int) -> tuple[int, int, int] | None:
    """``(start, end, step)`` of a Slice that takes a forward range of the last axis only, else None."""
    inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts, ends = _ints(inputs[1]), _ints(inputs[2])
    axes = _ints(inputs[3]) if inputs[3] is not None else [0]
    steps = _ints(inputs[4]) if inputs[4] is not None else [1]
    if starts is None or ends is None or axes is None or steps is None:
        return None
    if not len(starts) == len(ends) == len(axes) == len(steps) == 1 or steps[0] < 1:
        return None
    if axes[0] % rank != rank - 1:
        return None

    def clamp(index: int) -> int:
        return min(max(index + width if index < 0 else index, 0), width)

    return clamp(starts[0]), clamp(ends[0]), steps[0]


def _split_sizes(node: ir.Node, rank: int, width: int) -> list[int] | None:
    """The sizes a Split cuts the last axis into, else None."""
    if _axis(node, rank) != rank - 1:
        return None
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return _ints(node.inputs[1])
    count = len(node.outputs)
    return [width // count] * count if width % count == 0 else None


def _typed(value: ir.Value, dtype: ir.DataType, dims: Sequence[int | ir.SymbolicDim]) -> ir.Value:
    value.type, value.shape = ir.TensorType(dtype), ir.Shape(list(dims))
    return value


# --- the full rotation -----------------------------------------------------------------------------------------


class _Layout:
    """How x and one cos/sin table line up: x is [B, (H,) S, D]; the table broadcasts as [c0, (1,) c2, D]."""

    def __init__(self, x: ir.Value, table: ir.Value, interleaved: bool) -> None:
        self.x, self.table, self.interleaved = x, table, interleaved
        x_dims = list(x.shape.dims)
        self.batch, self.seq, self.width = x_dims[0], x_dims[-2], x_dims[-1]
        self.half = self.width // 2
        padded = [1] * (len(x_dims) - table.shape.rank()) + list(table.shape.dims)
        self.table_batch, self.table_seq = padded[0], padded[-2]
        self.expand = not (_same_dim(self.table_batch, self.batch) and _same_dim(self.table_seq, self.seq))

    @staticmethod
    def failure(x: ir.Value, table: ir.Value, interleaved: bool) -> str | None:
        """Why ``table`` cannot serve as a cache for x (None if it can)."""
        shape = table.shape
        if shape is None or shape.rank() == 0 or shape.rank() > x.shape.rank():
            return f"{table.name}: rank unknown or above x's"
        if table.dtype != x.dtype:
            return f"{table.name}: dtype differs from x's"
        padded = [1] * (x.shape.rank() - shape.rank()) + list(shape.dims)
        if padded[-1] != x.shape[-1]:
            return f"{table.name}: last dimension is not x's head size"
        if x.shape.rank() == 4 and padded[1] != 1:
            return f"{table.name}: not the same for every head (dimension 1 is not 1)"
        for axis in (0, -2):
            if not (_same_dim(padded[axis], 1) or _same_dim(padded[axis], x.shape[axis])):
                return f"{table.name}: dimension {axis} is neither 1 nor x's"
        if not _repeats(table, interleaved):
            what = "neighbours 2i, 2i+1" if interleaved else "two halves"
            return f"{table.name}: cannot prove the {what} of its last axis equal"
        return None


class _CacheBuilder:
    """Builds the [B, S, D/2] caches RotaryEmbedding takes; constant ones become initializers shared by q and k."""

    def __init__(self, graph: ir.Graph) -> None:
        self._graph = graph
        self._constant_halves: dict[tuple[ir.Value, bool], ir.Value] = {}
        self._names: set[str] | None = None

    def caches(
        self, op: pattern.RewriterContext, x: ir.Value, cos: ir.Value, sin: ir.Value, interleaved: bool
    ) -> list[ir.Value]:
        """The cos and sin caches for x; the [B, S, D/2] shape broadcast ones expand to is built once for both."""
        target: list[ir.Value] = []
        results = []
        for table in (cos, sin):
            layout = _Layout(x, table, interleaved)
            half = self._constant_half(op, layout)
            if half is None:
                half = self._runtime_half(op, layout)
            if layout.expand:
                target = target or [self._expanded_shape(op, layout)]
                half = _typed(op.Expand(half, target[0]), table.dtype, [layout.batch, layout.seq, layout.half])
            results.append(half)
        return results

    def _constant_half(self, op: pattern.RewriterContext, layout: _Layout) -> ir.Value | None:
        table = layout.table
        if (table, layout.interleaved) in self._constant_halves:
            return self._constant_halves[table, layout.interleaved]
        array = _constant(table)
        if array is None:
            return None
        rows = array.reshape(-1, array.shape[-2] if array.ndim > 1 else 1, array.shape[-1])
        rows = rows[..., 0::2] if layout.interleaved else rows[..., : layout.half]
        tensor = ir.Tensor(np.ascontiguousarray(rows), dtype=table.dtype)
        value = op.initializer(tensor, name=self._unique_name(f"{table.name}_rotary_half"))
        self._constant_halves[table, layout.interleaved] = value
        return value

    def _runtime_half(self, op: pattern.RewriterContext, layout: _Layout) -> ir.Value:
        table, dtype = layout.table, layout.table.dtype
        dims = list(table.shape.dims)
        # The first half, or interleaved, the even positions.
        end, step = (layout.width, 2) if layout.interleaved else (layout.half, 1)
        half = op.Slice(table, _int64(op, [0]), _int64(op, [end]), _int64(op, [-1]), _int64(op, [step]))
        half = _typed(half, dtype, [*dims[:-1], layout.half])
        rank = len(dims)
        if rank == 4:  # [c0, 1, c2, D/2]
            return _typed(op.Squeeze(half, _int64(op, [1])), dtype, [dims[0], dims[2], layout.half])
        if rank < 3:
            lead = 3 - rank
            return _typed(
                op.Unsqueeze(half, _int64(op, list(range(lead)))), dtype, [*([1] * lead), *dims[:-1], layout.half]
            )
        return half

    def _expanded_shape(self, op: pattern.RewriterContext, layout: _Layout) -> ir.Value:
        batch, seq = _static(layout.batch), _static(layout.seq)
        if batch is not None and seq is not None:
            return _int64(op, [batch, seq, layout.half])
        source = _last_axis_source(layout.x)
        x_rank = source.shape.rank()
        pieces = [
            _typed(op.Shape(source, start=0, end=1), ir.DataType.INT64, [1]),
            _typed(op.Shape(source, start=x_rank - 2, end=x_rank - 1), ir.DataType.INT64, [1]),
            _int64(op, [layout.half]),
        ]
        return _typed(op.Concat(*pieces, axis=0), ir.DataType.INT64, [3])

    def _unique_name(self, base: str) -> str:
        if self._names is None:
            self._names = set(self._graph.initializers)
            self._names.update(value.name for value in self._graph.inputs if value.name)
            for node in ir.traversal.RecursiveGraphIterator(self._graph):
                self._names.update(value.name for value in node.outputs if value.name)
        name, index = base, 0
        while name in self._names:
            index += 1
            name = f"{base}_{index}"
        self._names.add(name)
        return name


def _last_axis_source(x: ir.Value) -> ir.Value:
    """The tensor x was cut from along its last axis (x itself if none): it has x's batch and sequence sizes.

    Reading the shape from there keeps x's own producer free for the partial-rotary rule to remove.
    """
    node = x.producer()
    while node is not None and node.op_type in ("Slice", "Split") and node.inputs[0] is not None:
        source = node.inputs[0]
        width = _last_dim(source)
        if width is None or source.shape.rank() != x.shape.rank():
            break
        rank = source.shape.rank()
        cut = _slice_range(node, rank, width) if node.op_type == "Slice" else _split_sizes(node, rank, width)
        if cut is None:
            break
        x, node = source, source.producer()
    return x


def _int64(op: pattern.RewriterContext, values: list[int]) -> ir.Value:
    value = op.Constant(value=ir.tensor(np.array(values, dtype=np.int64)))
    return _typed(value, ir.DataType.INT64, [len(values)])


class _RotaryFusion(pattern.RewriteRuleClassBase):
    """``x * cos + rotate_half(x) * sin`` -> ``RotaryEmbedding(x, cos[..., :D/2], sin[..., :D/2])``."""

    def __init__(self, caches: _CacheBuilder) -> None:
        super().__init__(name=type(self).__name__)
        self._caches = caches

    def rotate_half(self, op: pattern.RewriterContext, x: ir.Value) -> ir.Value:
        raise NotImplementedError

    interleaved = False

    def rotation_failure(self, x: ir.Value, rank: int, width: int, bindings: dict[str, ir.Value]) -> str | None:
        """Why the matched rotation is not rotate_half(x) (None if it is)."""
        raise NotImplementedError

    def pattern(self, op: pattern.RewriterContext, x: ir.Value, cos: ir.Value, sin: ir.Value) -> ir.Value:
        return op.Add(op.Mul(x, cos), op.Mul(self.rotate_half(op, x), sin))

    def check(
        self,
        op: pattern.RewriterContext,
        x: ir.Value,
        cos: ir.Value,
        sin: ir.Value,
        **bindings: ir.Value,
    ) -> pattern.MatchResult:
        result = pattern.MatchResult()
        shape = x.shape
        if shape is None or shape.rank() not in (3, 4):
            return result.fail("x is not known to be 3-D or 4-D", x)
        width = _static(shape[-1])
        if width is None or width % 2 or width < 2:
            return result.fail("x's last dimension is not static and even", x)
        if x.dtype not in _ROTARY_DTYPES:
            return result.fail("RotaryEmbedding takes float32, float16 or bfloat16 only", x)
        reason = self.rotation_failure(x, shape.rank(), width, bindings)
        if reason is not None:
            return result.fail(reason, bindings["rotated"])
        for table in (cos, sin):
            reason = _Layout.failure(x, table, self.interleaved)
            if reason is not None:
                return result.fail(reason, table)
        return result

    def rewrite(self, op: pattern.RewriterContext, x: ir.Value, cos: ir.Value, sin: ir.Value, **_: object) -> ir.Value:
        attributes = {"interleaved": int(self.interleaved)}
        if x.shape.rank() == 3:
            attributes["num_heads"] = 1
        cos_cache, sin_cache = self._caches.caches(op, x, cos, sin, self.interleaved)
        output = op.RotaryEmbedding(x, cos_cache, sin_cache, **attributes)
        return _typed(output, x.dtype, list(x.shape.dims))


class SplitRotaryFusion(_RotaryFusion):
    """rotate_half written with ``x.chunk(2, -1)``: ``Split`` into two outputs."""

    def rotate_half(self, op: pattern.RewriterContext, x: ir.Value) -> ir.Value:
        first, second = op.Split(x, _allow_other_inputs=True, _outputs=["first", "second"])
        return op.Concat(op.Neg(second), first, _outputs=["rotated"])

    def rotation_failure(self, x: ir.Value, rank: int, width: int, bindings: dict[str, ir.Value]) -> str | None:
        if _axis(bindings["rotated"].producer(), rank) != rank - 1:
            return "rotate_half does not concatenate on the last axis"
        if _split_sizes(bindings["first"].producer(), rank, width) != [width // 2, width // 2]:
            return "rotate_half does not split the last axis in halves"
        return None


class SliceRotaryFusion(_RotaryFusion):
    """rotate_half written with ``x[..., :d // 2]`` and ``x[..., d // 2:]``: two ``Slice`` nodes."""

    def rotate_half(self, op: pattern.RewriterContext, x: ir.Value) -> ir.Value:
        first = op.Slice(x, _allow_other_inputs=True, _outputs=["first"])
        second = op.Slice(x, _allow_other_inputs=True, _outputs=["second"])
        return op.Concat(op.Neg(second), first, _outputs=["rotated"])

    def rotation_failure(self, x: ir.Value, rank: int, width: int, bindings: dict[str, ir.Value]) -> str | None:
        if _axis(bindings["rotated"].producer(), rank) != rank - 1:
            return "rotate_half does not concatenate on the last axis"
        half = width // 2
        first, second = (_slice_range(bindings[name].producer(), rank, width) for name in ("first", "second"))
        if first != (0, half, 1) or second != (half, width, 1):
            return "rotate_half does not split the last axis in halves"
        return None


class InterleavedRotaryFusion(_RotaryFusion):
    """GPT-J's rotate_every_two: ``stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)``; constant tables only."""

    interleaved = True

    def rotate_half(self, op: pattern.RewriterContext, x: ir.Value) -> ir.Value:
        even = op.Slice(x, _allow_other_inputs=True, _outputs=["even"])
        odd = op.Slice(x, _allow_other_inputs=True, _outputs=["odd"])
        negated = op.Unsqueeze(op.Neg(odd), _allow_other_inputs=True, _outputs=["negated_pair"])
        pairs = op.Concat(negated, op.Unsqueeze(even, _allow_other_inputs=True, _outputs=["even_pair"]))
        return op.Reshape(pairs, _allow_other_inputs=True, _outputs=["rotated"])

    def rotation_failure(self, x: ir.Value, rank: int, width: int, bindings: dict[str, ir.Value]) -> str | None:
        even, odd = (_slice_range(bindings[name].producer(), rank, width) for name in ("even", "odd"))
        if even != (0, width, 2) or odd != (1, width, 2):
            return "not the even and odd positions of the last axis"
        for name in ("negated_pair", "even_pair"):
            axes = _ints(bindings[name].producer().inputs[1])
            if axes not in ([-1], [rank]):
                return "the pairs are not stacked on a new last axis"
        pairs = bindings["rotated"].producer().inputs[0]
        if _axis(pairs.producer(), rank + 1) != rank:
            return "the pairs are not stacked on a new last axis"
        rotated = bindings["rotated"]
        if pairs.shape is None or rotated.shape is None or rotated.shape.rank() != rank:
            return "the flattened pairs' shapes are unknown"
        kept = list(pairs.shape.dims)[:-2]
        if not all(_same_dim(a, b) for a, b in zip(kept, list(x.shape.dims)[:-1], strict=True)):
            return "the Reshape does not merge only the two last axes"
        if not all(_same_dim(a, b) for a, b in zip(rotated.shape.dims, x.shape.dims, strict=True)):
            return "the Reshape does not give x's shape back"
        return None


# --- partial rotation: Concat(RotaryEmbedding(x[..., :r]), x[..., r:]) -> rotary_embedding_dim=r ----------------


class _PartialRotaryFusion(pattern.RewriteRuleClassBase):
    def __init__(self) -> None:
        super().__init__(name=type(self).__name__)

    def parts(self, op: pattern.RewriterContext, x: ir.Value) -> tuple[ir.Value, ir.Value]:
        raise NotImplementedError

    def cut(self, part: ir.Value, rest: ir.Value, rank: int, width: int) -> int | None:
        """r if ``part``/``rest`` are ``x[..., :r]``/``x[..., r:]``, else None."""
        raise NotImplementedError

    def pattern(self, op: pattern.RewriterContext, x: ir.Value) -> ir.Value:
        part, rest = self.parts(op, x)
        rotated = op.RotaryEmbedding(part, _allow_other_inputs=True, _outputs=["rotated"])
        return op.Concat(rotated, rest, _outputs=["joined"])

    def check(
        self,
        op: pattern.RewriterContext,
        x: ir.Value,
        part: ir.Value,
        rest: ir.Value,
        rotated: ir.Value,
        joined: ir.Value,
        **_: object,
    ) -> pattern.MatchResult:
        result = pattern.MatchResult()
        shape = x.shape
        if shape is None or shape.rank() not in (3, 4) or _static(shape[-1]) is None:
            return result.fail("x is not 3-D or 4-D with a static last dimension", x)
        rank, width = shape.rank(), shape[-1]
        if _axis(joined.producer(), rank) != rank - 1:
            return result.fail("the parts are not concatenated on the last axis", joined)
        attributes = rotated.producer().attributes
        if attributes.get_int("rotary_embedding_dim", 0):
            return result.fail("already partial", rotated)
        if rank == 3 and attributes.get_int("num_heads", 0) != 1:
            return result.fail("3-D input with several heads: the cut is not per head", rotated)
        cut = self.cut(part, rest, rank, width)
        if cut is None or cut % 2 or not 0 < cut < width:
            return result.fail("x is not cut in two at an even position of its last axis", part)
        return result

    def rewrite(self, op: pattern.RewriterContext, x: ir.Value, part: ir.Value, rotated: ir.Value, **_: object):
        node = rotated.producer()
        attributes = {name: attr.value for name, attr in node.attributes.items()}
        attributes["rotary_embedding_dim"] = _static(part.shape[-1])
        output = op.RotaryEmbedding(x, *node.inputs[1:], **attributes)
        return _typed(output, x.dtype, list(x.shape.dims))


class SlicePartialRotaryFusion(_PartialRotaryFusion):
    def parts(self, op: pattern.RewriterContext, x: ir.Value) -> tuple[ir.Value, ir.Value]:
        part = op.Slice(x, _allow_other_inputs=True, _outputs=["part"])
        rest = op.Slice(x, _allow_other_inputs=True, _outputs=["rest"])
        return part, rest

    def cut(self, part: ir.Value, rest: ir.Value, rank: int, width: int) -> int | None:
        first = _slice_range(part.producer(), rank, width)
        second = _slice_range(rest.producer(), rank, width)
        if first is None or second is None or first[0::2] != (0, 1) or second != (first[1], width, 1):
            return None
        return first[1]


class SplitPartialRotaryFusion(_PartialRotaryFusion):
    def parts(self, op: pattern.RewriterContext, x: ir.Value) -> tuple[ir.Value, ir.Value]:
        part, rest = op.Split(x, _allow_other_inputs=True, _outputs=["part", "rest"])
        return part, rest

    def cut(self, part: ir.Value, rest: ir.Value, rank: int, width: int) -> int | None:
        sizes = _split_sizes(part.producer(), rank, width)
        return sizes[0] if sizes is not None and len(sizes) == 2 and sum(sizes) == width else None
