"""Losses: cross entropy, chunked linear cross entropy."""

from __future__ import annotations

from onnxscript import INT64
from onnxscript import opset18 as op

from fx2onnx._lowerings.builders import TFloat, _back, _const, _in_float32
from fx2onnx._lowerings.rules import lowering


@lowering("aten::cross_entropy_loss")
def cross_entropy_probabilities(
    self: TFloat,
    target: TFloat,
    weight: TFloat | None = None,
    reduction: int = 1,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> TFloat:
    """Cross entropy against class probabilities (a float target shaped like the input).

    loss[n, ...] = -sum_c weight[c] * target[n, c, ...] * log_softmax(input)[n, c, ...]; mean divides by the
    number of samples (not by the weights). Integer class targets keep torchlib's implementation.
    """
    del ignore_index  # only class-index targets have one
    x, probabilities = _in_float32(self), _in_float32(target)
    rank = len(self.shape)
    class_axis = 1 if rank > 1 else 0
    classes = self.shape[class_axis]
    if label_smoothing > 0:
        probabilities = op.Add(
            op.Mul(probabilities, _const(1.0 - label_smoothing, x)), _const(label_smoothing / classes, x)
        )
    log_probabilities = op.LogSoftmax(x, axis=class_axis)
    terms = op.Mul(probabilities, log_probabilities)
    if weight is not None:
        shape = [1] * rank
        shape[class_axis] = -1
        terms = op.Mul(terms, op.Reshape(_in_float32(weight), op.Constant(value_ints=shape)))
    losses = op.Neg(op.ReduceSum(terms, op.Constant(value_ints=[class_axis]), keepdims=False))
    if reduction == 0:
        result = losses
    elif reduction == 2:
        result = op.ReduceSum(losses, keepdims=False)
    else:
        result = op.ReduceMean(losses, keepdims=False)
    return _back(result, self)


# --- cross entropy with class-index targets ---------------------------------------------------------------------------
# torchlib's aten::cross_entropy_loss ignores label_smoothing and fails on unbatched input ([C] logits, 0-d target).
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _class_cross_entropy(
    logits: TFloat,
    target: INT64,
    weight: TFloat | None,
    reduction: str,
    ignore_index: int,
    label_smoothing: float,
) -> TFloat:
    """Eager's cross_entropy for class indices, in the logits' dtype (callers pass float32 for half types).

    Per sample: (1 - s) * w[t] * -log_softmax[t] + s / C * sum_c w[c] * -log_softmax[c], ignored samples 0;
    'mean' divides both sums by the sum of w[t] over the kept samples (NaN when every sample is ignored).
    """
    unbatched = len(logits.shape) == 1
    rank = max(len(logits.shape), 2)
    zero_axis = op.Constant(value_ints=[0])
    if unbatched:
        logits, target = op.Unsqueeze(logits, zero_axis), op.Unsqueeze(target, zero_axis)
    class_axis = op.Constant(value_ints=[1])
    log_probabilities = op.LogSoftmax(logits, axis=1)
    ignored = op.Equal(target, op.Constant(value_int=ignore_index))
    safe_target = op.Where(ignored, op.Constant(value_int=0), target)
    picked = op.Squeeze(op.GatherElements(log_probabilities, op.Unsqueeze(safe_target, class_axis), axis=1), class_axis)
    zero = op.CastLike(0.0, logits)
    if weight is not None:
        target_weight = op.Where(ignored, zero, op.Gather(weight, safe_target, axis=0))
    else:
        target_weight = op.Where(ignored, zero, op.CastLike(1.0, logits))
    losses = op.Neg(op.Mul(picked, target_weight))
    smooth = None
    if label_smoothing > 0:
        terms = log_probabilities
        if weight is not None:
            terms = op.Mul(terms, op.Reshape(weight, op.Constant(value_ints=[1, -1] + [1] * (rank - 2))))
        smooth = op.Where(ignored, zero, op.Neg(op.ReduceSum(terms, class_axis, keepdims=False)))
        classes = op.CastLike(op.Shape(logits, start=1, end=2), logits)
        smooth = op.Div(op.Mul(smooth, op.CastLike(label_smoothing, logits)), classes)
        losses = op.Mul(losses, op.CastLike(1.0 - label_smoothing, logits))
    if reduction == "none":
        result = losses if smooth is None else op.Add(losses, smooth)
        return op.Squeeze(result, zero_axis) if unbatched else result
    total = op.ReduceSum(losses, keepdims=False)
    if smooth is not None:
        total = op.Add(total, op.ReduceSum(smooth, keepdims=False))
    if reduction == "sum":
        return total
    return op.Div(total, op.ReduceSum(target_weight, keepdims=False))


@lowering("aten::cross_entropy_loss")
def cross_entropy_loss_classes(
    self: TFloat,
    target: INT64,
    weight: TFloat | None = None,
    reduction: int = 1,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> TFloat:
    """Cross entropy against class indices: unbatched inputs and label smoothing as in eager."""
    x = _in_float32(self)
    class_weight = _in_float32(weight) if weight is not None else None
    loss = _class_cross_entropy(x, target, class_weight, _REDUCTIONS[reduction], ignore_index, label_smoothing)
    return _back(loss, self)


def _linear_logits(input: TFloat, linear_weight: TFloat, linear_bias: TFloat | None) -> TFloat:
    """input @ linear_weight.T (+ bias) in float32: [N, H] x [C, H] -> [N, C]."""
    x = _in_float32(input)
    logits = op.MatMul(x, op.Transpose(op.CastLike(linear_weight, x), perm=[1, 0]))
    if linear_bias is not None:
        logits = op.Add(logits, op.CastLike(linear_bias, x))
    return logits


def _empty_gradient(like: TFloat, rank: int) -> TFloat:
    return op.CastLike(op.ConstantOfShape(op.Constant(value_ints=[0] * rank)), like)


@lowering("torch_nn::_linear_cross_entropy_batch_chunked")
def linear_cross_entropy_batch_chunked(
    input: TFloat,
    linear_weight: TFloat,
    target: INT64,
    linear_bias: TFloat | None = None,
    weight: TFloat | None = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    batch_chunk_size: int = 0,
    acc_policy: str = "auto",
    acc_dtype: int | None = None,
    allow_retain_graph: bool = False,
    compute_input_grad: bool = False,
    compute_linear_weight_grad: bool = False,
    compute_linear_bias_grad: bool = False,
) -> tuple[TFloat, TFloat, TFloat, TFloat]:
    """linear_cross_entropy's chunked path (mean/sum) as one linear + cross entropy: chunking only saves memory.

    Returns (loss, grad_input, grad_linear_weight, grad_linear_bias); the gradients are the empty placeholders
    eager returns when no gradient is needed (an exported model runs without autograd).
    """
    del batch_chunk_size, acc_policy, acc_dtype, allow_retain_graph
    if compute_input_grad or compute_linear_weight_grad or compute_linear_bias_grad:
        raise NotImplementedError("linear_cross_entropy's precomputed gradients are not exported; export in eval mode")
    logits = _linear_logits(input, linear_weight, linear_bias)
    class_weight = _in_float32(weight) if weight is not None else None
    loss = _back(_class_cross_entropy(logits, target, class_weight, reduction, ignore_index, label_smoothing), input)
    return loss, _empty_gradient(input, 2), _empty_gradient(input, 2), _empty_gradient(input, 1)


@lowering("torch_nn::_linear_cross_entropy_batch_chunked_no_reduction")
def linear_cross_entropy_batch_chunked_no_reduction(
    input: TFloat,
    linear_weight: TFloat,
    target: INT64,
    linear_bias: TFloat | None = None,
    weight: TFloat | None = None,
    ignore_index: int = -100,
    batch_chunk_size: int = 0,
    acc_policy: str = "auto",
    acc_dtype: int | None = None,
) -> TFloat:
    """Per-sample losses [N] of linear_cross_entropy's chunked path with reduction='none'."""
    del batch_chunk_size, acc_policy, acc_dtype
    logits = _linear_logits(input, linear_weight, linear_bias)
    class_weight = _in_float32(weight) if weight is not None else None
    return _back(_class_cross_entropy(logits, target, class_weight, "none", ignore_index, 0.0), input)
